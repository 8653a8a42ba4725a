"""The Helm chart, rendered offline by Helm, checked object by object.

Each rendering is checked against the official Kubernetes client's models (tests/deploy/
chart.py), then for what a cluster would not catch until the workers run: the probes, the
drain, the environment the workers start with (read by hark's own settings loader), and
that every Service, selector and reference finds what it points at.
"""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

import hark
from hark.config import Settings, env_var, load_settings
from hark.server.auth import check_bind_policy
from hark.server.workers import STOP_TIMEOUT_S
from hark.server.workers import worker_settings as process_settings
from tests.deploy.chart import CHART, HelmRenderError, Rendered, check_object, lint, render

# What the downward API hands a worker in these tests.
POD_IP = "10.1.2.3"
NODE_IP = "192.0.2.10"
DEFAULTS = Settings()

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-redis": {"redis": {"enabled": False, "url": "redis://redis.internal:6380/2"}},
    "redis-url-secret": {"redis": {"enabled": False, "urlSecret": "fleet-redis"}},
    "redis-tls": {"redis": {"tls": {"enabled": True, "secret": "redis-cert"}}},
    "existing-fleet-secrets": {
        "fleetSecret": {"existingSecret": "fleet", "existingSecretKey": "secret"},
        "redis": {"auth": {"existingSecret": "redis-auth", "existingSecretKey": "password"}},
    },
    "vllm": {"vllm": {"enabled": True}, "llm": {"urls": ["http://backup-llm:8001/v1"]}},
    "remote-llm": {"llm": {"urls": ["http://gpu-box:8001/v1"], "model": "qwen2.5-7b"}},
    "hpa-sessions": {"autoscaling": {"sessions": {"enabled": True}}},
    "no-hpa": {"autoscaling": {"enabled": False}, "replicaCount": 3},
    "no-media": {"media": {"enabled": False}},
    "media-fixed-ip": {"media": {"advertiseIP": "203.0.113.9"}},
    "ingress": {"ingress": {"enabled": True, "className": "nginx", "tlsSecret": "hark-tls"}},
    "existing-keys": {"apiKeys": {"existingSecret": "clients", "existingSecretKey": "keys"}},
    "given-keys": {"apiKeys": {"keys": ["sk-one", "sk-two"]}, "hark": {"zone": "eu-west-1a"}},
    "long-drain": {"hark": {"drainTimeoutSeconds": 900, "preStopSleepSeconds": 10}},
    "limits": {"hark": {"keyMaxSessions": 10, "keyTokensPerMinute": 50000}},
    "workers": {"hark": {"workers": 3}},
    "hop-tls": {"hopTls": {"enabled": True, "secret": "hop-cert"}, "hark": {"workers": 3}},
    "no-policies": {
        "networkPolicy": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "serviceAccount": {"create": False},
    },
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(VARIANTS[request.param])


def _worker(r: Rendered) -> dict[str, Any]:
    return r.one("Deployment", "worker")


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _port(container: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for p in container["ports"] if p["name"] == name]
    assert len(found) == 1, f"container {container['name']} has no port {name}"
    return found[0]


# What stands in for a Secret the user keeps outside the chart, by the variable it fills.
KEPT_SECRETS = {
    "HARK_API_KEYS": "sk-kept-one,sk-kept-two",
    "HARK_REDIS_URL": "rediss://:password@redis.example:6380/0",
    "HARK_LLM_API_KEY": "sk-llm",
    "HARK_FLEET_SECRET": "a-fleet-secret-kept-outside-the-chart",
    "REDIS_PASSWORD": "kept-redis-password",
}


def _secret_value(r: Rendered, variable: str, name: str, key: str) -> str:
    made = [s for s in r.all("Secret") if s["metadata"]["name"] == name]
    if not made:
        return KEPT_SECRETS[variable]
    return base64.b64decode(made[0]["data"][key]).decode()


def worker_environment(r: Rendered) -> dict[str, str]:
    """The workers' environment as the kubelet would build it: downward API fields, Secret
    references, and ``$(VAR)`` expanded from the variables defined before."""
    env: dict[str, str] = {}
    for var in _container(_worker(r))["env"]:
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(var["value"])
            )
        elif "fieldRef" in (source := var["valueFrom"]):
            env[var["name"]] = {"status.podIP": POD_IP, "status.hostIP": NODE_IP}[
                source["fieldRef"]["fieldPath"]
            ]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = _secret_value(r, var["name"], ref["name"], ref["key"])
    return env


def worker_settings(r: Rendered) -> Settings:
    """What ``hark serve`` in a worker pod would run with."""
    return load_settings(env=worker_environment(r))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pods_selected(r: Rendered, selector: dict[str, str]) -> list[dict[str, Any]]:
    return [
        d
        for d in r.all("Deployment")
        if _selects(selector, d["spec"]["template"]["metadata"]["labels"])
    ]


def test_every_object_fits_the_kubernetes_models(rendered: Rendered) -> None:
    assert rendered.objects
    errors = [e for obj in rendered.objects for e in check_object(obj)]
    assert errors == []
    names = [(o["kind"], o["metadata"]["name"]) for o in rendered.objects]
    assert len(names) == len(set(names)), "two objects of one kind share a name"


def test_helm_lint_finds_nothing_wrong() -> None:
    for values in VARIANTS.values():
        report = lint(values)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] > 1] == []


def test_probes_use_the_servers_paths_and_port(rendered: Rendered) -> None:
    container = _container(_worker(rendered))
    settings = worker_settings(rendered)
    http = _port(container, "http")
    assert http["containerPort"] == settings.port == DEFAULTS.port
    assert http["protocol"] == "TCP"
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        action = container[probe]["httpGet"]
        assert action["path"] == path
        assert action["port"] in ("http", settings.port)


def test_workers_start_with_settings_the_server_accepts(rendered: Rendered) -> None:
    env = worker_environment(rendered)
    settings = load_settings(env=env)
    assert settings.host == "0.0.0.0"
    # Not on loopback: the server refuses to start without keys.
    assert settings.api_keys
    check_bind_policy(settings.host, settings.api_keys)
    if settings.workers == 1:
        assert settings.advertise_url == f"http://{POD_IP}:{settings.port}"
    else:
        # Each process advertises its own port: one URL for all of them would be wrong.
        assert settings.advertise_url is None
    assert settings.redis_url
    for name in env:
        if name.startswith("HARK_"):
            assert name in {env_var(f) for f in Settings.__dataclass_fields__}, name


def test_drain_fits_in_the_grace_period(rendered: Rendered) -> None:
    pod = _worker(rendered)["spec"]["template"]["spec"]
    container = _container(_worker(rendered))
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    drain = worker_settings(rendered).drain_timeout
    # Kubernetes counts the grace period from the preStop hook's start; after the drain the
    # worker still closes what is left, as long as --workers' parent waits for it.
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + STOP_TIMEOUT_S


def test_everything_runs_as_non_root(rendered: Rendered) -> None:
    for deployment in rendered.all("Deployment"):
        if deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "vllm":
            continue  # vLLM's image runs as root; it is optional and not ours.
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_services_reach_their_pods(rendered: Rendered) -> None:
    for service in rendered.all("Service"):
        targets = _pods_selected(rendered, service["spec"]["selector"])
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {targets}"
        container = _container(targets[0])
        for port in service["spec"]["ports"]:
            assert _port(container, port["targetPort"])["protocol"] == port["protocol"]
    worker_service = rendered.one("Service", "worker")
    assert _pods_selected(rendered, worker_service["spec"]["selector"]) == [_worker(rendered)]


def test_disruptions_and_autoscaling_act_on_the_workers(rendered: Rendered) -> None:
    worker = _worker(rendered)
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    assert _selects(worker["spec"]["selector"]["matchLabels"], pod_labels)
    for pdb in rendered.all("PodDisruptionBudget"):
        assert _pods_selected(rendered, pdb["spec"]["selector"]["matchLabels"]) == [worker]
    hpas = rendered.all("HorizontalPodAutoscaler")
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", worker["metadata"]["name"])
        assert hpa["spec"]["minReplicas"] >= 2
    # With an autoscaler the Deployment leaves the count to it, or each upgrade resets it.
    assert ("replicas" in worker["spec"]) == (not hpas)


def test_defaults_scale_on_cpu_and_sessions_on_request() -> None:
    (metric,) = render().one("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    metrics = render(VARIANTS["hpa-sessions"]).one("HorizontalPodAutoscaler")["spec"]["metrics"]
    pods = [m["pods"] for m in metrics if m["type"] == "Pods"]
    assert [p["metric"]["name"] for p in pods] == ["hark_sessions_active"]
    assert render(VARIANTS["no-hpa"]).one("Deployment", "worker")["spec"]["replicas"] == 3


def test_each_worker_takes_the_udp_port_on_its_node() -> None:
    r = render()
    settings = worker_settings(r)
    rtc = _port(_container(_worker(r)), "rtc")
    assert rtc["protocol"] == "UDP"
    assert rtc["containerPort"] == rtc["hostPort"] == settings.rtc_port == DEFAULTS.rtc_port
    assert settings.rtc_advertise_ip == NODE_IP
    fixed = worker_settings(render(VARIANTS["media-fixed-ip"]))
    assert fixed.rtc_advertise_ip == "203.0.113.9"
    without = render(VARIANTS["no-media"])
    assert "hostPort" not in _port(_container(_worker(without)), "rtc")
    assert worker_settings(without).rtc_advertise_ip is None


def test_every_process_of_a_pod_gets_its_udp_port_on_the_node() -> None:
    r = render(VARIANTS["workers"])
    settings = worker_settings(r)
    assert settings.workers == 3
    udp = {p["containerPort"]: p for p in _container(_worker(r))["ports"] if p["protocol"] == "UDP"}
    ports = [process_settings(settings, i).rtc_port for i in range(settings.workers)]
    assert sorted(udp) == ports
    assert all(udp[port]["hostPort"] == port for port in ports)


def test_redis_in_the_chart_is_what_the_workers_use() -> None:
    r = render()
    url = urlsplit(worker_settings(r).redis_url or "")
    service = r.named("Service", url.hostname or "")
    assert [p["port"] for p in service["spec"]["ports"]] == [url.port]
    (redis,) = _pods_selected(r, service["spec"]["selector"])
    assert redis["spec"]["replicas"] == 1
    args = _container(redis)["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    # Redis asks for the password the workers send, which the chart made and keeps.
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    env = {var["name"]: var for var in _container(redis)["env"]}
    worker_env = {var["name"]: var for var in _container(_worker(r))["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"] == worker_env["REDIS_PASSWORD"]["valueFrom"]
    password = _secret_value(r, "REDIS_PASSWORD", "hark-fleet", "redis-password")
    assert len(password) >= 32 and url.password == password
    assert url.scheme == "redis"
    # And only the workers may reach it.
    policy = r.one("NetworkPolicy", "redis")
    assert _pods_selected(r, policy["spec"]["podSelector"]["matchLabels"]) == [redis]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert _pods_selected(r, source["podSelector"]["matchLabels"]) == [_worker(r)]


def test_redis_speaks_tls_when_asked_and_the_workers_check_its_certificate() -> None:
    r = render(VARIANTS["redis-tls"])
    url = urlsplit(worker_settings(r).redis_url or "")
    assert url.scheme == "rediss" and url.password
    ca = dict(p.split("=", 1) for p in url.query.split("&"))["ssl_ca_certs"]
    worker = _container(_worker(r))
    (mount,) = [m for m in worker["volumeMounts"] if ca.startswith(m["mountPath"] + "/")]
    (volume,) = [
        v for v in _worker(r)["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    assert volume["secret"]["secretName"] == "redis-cert"
    redis = r.one("Deployment", "redis")
    args = _container(redis)["args"]
    assert args[args.index("--port") + 1] == "0"
    assert int(args[args.index("--tls-port") + 1]) == url.port
    with pytest.raises(HelmRenderError, match=r"redis\.tls\.secret"):
        render({"redis": {"tls": {"enabled": True}}})


def test_workers_hop_over_tls_when_asked_each_process_on_its_port() -> None:
    assert worker_settings(render()).hop_tls_cert is None
    r = render(VARIANTS["hop-tls"])
    settings = worker_settings(r)
    files = [settings.hop_tls_cert, settings.hop_tls_key, settings.hop_tls_ca]
    worker = _container(_worker(r))
    (mount,) = [m for m in worker["volumeMounts"] if m["name"] == "hop-tls"]
    assert all(f and f.startswith(mount["mountPath"] + "/") for f in files)
    (volume,) = [
        v for v in _worker(r)["spec"]["template"]["spec"]["volumes"] if v["name"] == "hop-tls"
    ]
    assert volume["secret"]["secretName"] == "hop-cert"
    hop_ports = [_port(worker, name)["containerPort"] for name in ("hop", "hop-1", "hop-2")]
    assert hop_ports == [process_settings(settings, i).hop_port for i in range(3)]
    with pytest.raises(HelmRenderError, match=r"hopTls\.secret"):
        render({"hopTls": {"enabled": True}})


def test_the_fleet_secret_is_made_once_or_taken_from_a_secret() -> None:
    made = worker_settings(render())
    assert made.fleet_secret is not None and len(made.fleet_secret) >= 32
    r = render(VARIANTS["existing-fleet-secrets"])
    kept = worker_settings(r)
    assert kept.fleet_secret == KEPT_SECRETS["HARK_FLEET_SECRET"]
    assert urlsplit(kept.redis_url or "").password == KEPT_SECRETS["REDIS_PASSWORD"]
    # Nothing made for what the user keeps.
    assert [s["metadata"]["name"] for s in r.all("Secret")] == ["hark-api-keys"]
    refs = {
        v["name"]: v["valueFrom"]["secretKeyRef"]
        for v in _container(_worker(r))["env"]
        if "secretKeyRef" in v.get("valueFrom", {})
    }
    assert refs["HARK_FLEET_SECRET"] == {"name": "fleet", "key": "secret"}
    assert refs["REDIS_PASSWORD"] == {"name": "redis-auth", "key": "password"}


def test_an_external_redis_replaces_the_charts() -> None:
    r = render(VARIANTS["external-redis"])
    assert worker_settings(r).redis_url == "redis://redis.internal:6380/2"
    assert r.all("Deployment") == [_worker(r)]
    assert r.all("NetworkPolicy") == []
    secret = render(VARIANTS["redis-url-secret"])
    (ref,) = [
        v["valueFrom"]["secretKeyRef"]
        for v in _container(_worker(secret))["env"]
        if v["name"] == "HARK_REDIS_URL"
    ]
    assert ref == {"name": "fleet-redis", "key": "redis-url"}


def test_a_fleet_without_a_shared_store_does_not_render() -> None:
    with pytest.raises(HelmRenderError, match=r"redis\.url"):
        render({"redis": {"enabled": False}})
    with pytest.raises(HelmRenderError, match=r"llm\.model"):
        render({"llm": {"urls": ["http://gpu-box:8001/v1"]}})


def test_vllm_serves_the_workers_llm() -> None:
    r = render(VARIANTS["vllm"])
    vllm = r.one("Deployment", "vllm")
    container = _container(vllm)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    settings = worker_settings(r)
    urls = settings.llm_url
    assert urls[1:] == ("http://backup-llm:8001/v1",)
    first = urlsplit(urls[0])
    service = r.named("Service", first.hostname or "")
    assert _pods_selected(r, service["spec"]["selector"]) == [vllm]
    assert [p["port"] for p in service["spec"]["ports"]] == [first.port]
    args = container["args"]
    assert settings.llm_model == args[args.index("--served-model-name") + 1]
    assert int(args[args.index("--port") + 1]) == _port(container, "http")["containerPort"]
    # Without vLLM or URLs the workers run the embedded model.
    assert [d["metadata"]["name"] for d in render().all("Deployment")] == ["hark", "hark-redis"]
    assert worker_settings(render()).llm_url == ()


def test_api_keys_come_from_the_chosen_secret() -> None:
    given = worker_settings(render(VARIANTS["given-keys"]))
    assert given.api_keys == ("sk-one", "sk-two")
    assert given.zone == "eu-west-1a"
    made = worker_settings(render())
    (key,) = made.api_keys
    assert key.startswith("sk-hark-") and len(key) >= 40
    r = render(VARIANTS["existing-keys"])
    assert [s["metadata"]["name"] for s in r.all("Secret")] == ["hark-fleet"]
    (ref,) = [
        v["valueFrom"]["secretKeyRef"]
        for v in _container(_worker(r))["env"]
        if v["name"] == "HARK_API_KEYS"
    ]
    assert ref == {"name": "clients", "key": "keys"}


def test_chart_deploys_this_version_of_hark() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == hark.__version__
    image = _container(_worker(render()))["image"]
    assert image == f"hark:{hark.__version__}"
