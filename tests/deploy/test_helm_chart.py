"""The Helm chart, rendered offline by Helm, checked object by object.

Each rendering is checked against the official Kubernetes client's models (tests/deploy/
chart.py), then for what a cluster would not catch until the workers run: the probes, the
drain, the environment the workers start with (read by hark's own settings loader), and
that every Service, selector and reference finds what it points at.
"""

from __future__ import annotations

import argparse
import base64
import copy
import datetime
import http.server
import ipaddress
import json
import re
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pytest
import yaml

import hark
from hark.cluster.redis_url import with_password
from hark.config import Settings, env_var, load_settings
from hark.server.auth import check_bind_policy
from hark.server.workers import STOP_TIMEOUT_S
from hark.server.workers import worker_settings as process_settings
from tests.deploy.chart import (
    CHART,
    NAMESPACE,
    HelmRenderError,
    Rendered,
    check_object,
    lint,
    render,
)
from tests.helpers.net import free_port
from tests.observability.series import known_series

# What the downward API hands a worker in these tests.
POD_IP = "10.1.2.3"
NODE_IP = "192.0.2.10"
DEFAULTS = Settings()

# The chart generates no secret: every rendering names where they are. This one Secret of
# the user's holds them all unless a variant says otherwise.
KEPT = "hark-kept"
BASE: dict[str, Any] = {"existingSecret": KEPT}
RELAY = {"relay": {"enabled": True, "publicIP": "203.0.113.5"}}
NODES = [{"ipBlock": {"cidr": "10.0.0.0/16"}}]
SIP = {"sip": {"enabled": True}, "networkPolicy": {"nodePeers": NODES}}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """The layers of values merged as Helm merges -f files: maps deeply, the rest replaced."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


_VARIANTS: dict[str, dict[str, Any]] = {
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
        "redis": {"podDisruptionBudget": {"enabled": False}},
    },
    "relay": RELAY,
    "relay-workers": merged(RELAY, {"hark": {"workers": 3}, "relay": {"workers": 2}}),
    "node-external-ip": {"media": {"advertise": "externalIP"}},
    "sip": SIP,
    "sip-webhook-relay": merged(
        RELAY,
        SIP,
        {
            "sip": {
                "trunks": {"enabled": False},
                "webhook": {"url": "https://backend.example/sip"},
                "advertiseIP": "198.51.100.7",
            }
        },
    ),
    "sip-external-ip": merged(SIP, {"media": {"advertise": "externalIP"}}),
    "redis-acl": {"redis": {"auth": {"username": "hark"}}},
    "redis-sentinel": {
        "redis": {
            "enabled": False,
            "url": "redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster",
            "auth": {"external": True},
        }
    },
    "remote-speech": {
        "llm": {"urls": ["http://gpu-box:8001/v1"], "model": "qwen2.5-7b"},
        "speech": {"asrUrl": "http://gpu-box:8002/v1", "ttsUrl": "http://gpu-box:8003/v1"},
        "autoscaling": {"sessions": {"enabled": True}},
    },
    "inline-secrets": {
        "existingSecret": "",
        "apiKeys": {"keys": ["sk-inline"]},
        "fleetSecret": {"value": "an-inline-fleet-secret-of-some-length"},
        "redis": {"auth": {"password": "inline-redis-password"}},
    },
    "monitoring": merged(
        RELAY,
        {"metrics": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
    ),
    "rollout": {
        "rollout": {"maxSurge": "25%", "maxUnavailable": 1},
        "hark": {"terminationGracePeriodSeconds": 300},
    },
}
VARIANTS = {name: merged(BASE, values) for name, values in _VARIANTS.items()}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(VARIANTS[request.param])


def _worker(r: Rendered) -> dict[str, Any]:
    return r.one("Deployment", "worker")


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = _pod(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]


def _port(container: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for p in container["ports"] if p["name"] == name]
    assert len(found) == 1, f"container {container['name']} has no port {name}"
    return found[0]


# What stands in for a Secret the user keeps outside the chart, by the variable it fills.
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"a webhook signing key of 32 bytes").decode()
TRUNKS = [{"name": "pbx", "addresses": ["203.0.113.0/24"], "numbers": ["+15550100"]}]
KEPT_SECRETS = {
    "HARK_API_KEYS": "sk-kept-one,sk-kept-two,metrics:mk-kept-scraper",
    "HARK_REDIS_URL": "rediss://:password@redis.example:6380/0",
    "HARK_LLM_API_KEY": "sk-llm",
    "HARK_ASR_API_KEY": "sk-speech",
    "HARK_TTS_API_KEY": "sk-speech",
    "HARK_FLEET_SECRET": "a-fleet-secret-kept-outside-the-chart",
    "REDIS_PASSWORD": "kept redis password: any characters, / @ : % too",
    "HARK_REDIS_PASSWORD": "kept redis password: any characters, / @ : % too",
    "HARK_SIP_TRUNKS": json.dumps(TRUNKS),
    "HARK_SIP_WEBHOOK_SECRET": WEBHOOK_SECRET,
}
# What the chart's own Secret is called (secrets given inline in the values).
INLINE = "hark-inline"


def _secret_value(r: Rendered, variable: str, name: str, key: str) -> str:
    made = [s for s in r.all("Secret") if s["metadata"]["name"] == name]
    if not made:
        assert name != INLINE, f"{variable} refers to the chart's Secret, which was not made"
        return KEPT_SECRETS[variable]
    return base64.b64decode(made[0]["data"][key]).decode()


def environment(r: Rendered, container: dict[str, Any], pod_ip: str = POD_IP) -> dict[str, str]:
    """A container's environment as the kubelet would build it: downward API fields,
    Secret references, and ``$(VAR)`` expanded from the variables defined before."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(var["value"])
            )
        elif "fieldRef" in (source := var["valueFrom"]):
            env[var["name"]] = {
                "status.podIP": pod_ip,
                "status.hostIP": NODE_IP,
                "spec.nodeName": "node-a",
            }[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = _secret_value(r, var["name"], ref["name"], ref["key"])
    return env


def worker_environment(r: Rendered) -> dict[str, str]:
    """The workers' environment."""
    return environment(r, _container(_worker(r)))


# The node's ExternalIP in these tests, and the file the init container of media.advertise
# externalIP writes it to (test_each_pod_advertises_its_nodes_external_address runs it).
EXTERNAL_IP = "198.51.100.20"
NODE_CONFIG = "/run/hark/node/node.toml"


def settings_of(deployment: dict[str, Any], env: dict[str, str]) -> Settings:
    """What ``hark serve`` would run with in ``deployment``'s pods, given their environment;
    the init container's file, if any, as the options it holds (below the environment's)."""
    from_node: dict[str, str] = {}
    if env.get("HARK_CONFIG") == NODE_CONFIG:
        (init,) = _pod(deployment)["initContainers"]
        options = environment(Rendered([], ""), init)["HARK_NODE_OPTIONS"].split(",")
        assert not any(env_var(o) in env for o in options), "the environment would win"
        from_node = dict.fromkeys(options, EXTERNAL_IP)
        env = {k: v for k, v in env.items() if k != "HARK_CONFIG"}
    return load_settings(from_node, env=env)


def worker_settings(r: Rendered) -> Settings:
    """What ``hark serve`` in a worker pod would run with."""
    return settings_of(_worker(r), worker_environment(r))


def _sip(r: Rendered) -> dict[str, Any]:
    return r.one("Deployment", "sip")


def sip_environment(r: Rendered) -> dict[str, str]:
    """The SIP pods' environment: on hostNetwork, the pod's address is the node's."""
    return environment(r, _container(_sip(r)), pod_ip=NODE_IP)


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
    settings = settings_of(_worker(rendered), env)
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
        pod = _pod(deployment)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        # No pod of the chart mounts an API token (the init container of media.advertise
        # externalIP mounts a projected one of its own; the test of it says so).
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


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
    for deployment in rendered.all("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert _selects(deployment["spec"]["selector"]["matchLabels"], labels)
    # Each budget covers one Deployment, and the workers' covers the workers.
    for pdb in rendered.all("PodDisruptionBudget"):
        (target,) = _pods_selected(rendered, pdb["spec"]["selector"]["matchLabels"])
        component = pdb["metadata"]["labels"]["app.kubernetes.io/component"]
        assert target["metadata"]["labels"]["app.kubernetes.io/component"] == component
    hpas = rendered.all("HorizontalPodAutoscaler")
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", worker["metadata"]["name"])
        assert hpa["spec"]["minReplicas"] >= 2
    # With an autoscaler the Deployment leaves the count to it, or each upgrade resets it.
    assert ("replicas" in worker["spec"]) == (not hpas)


def test_defaults_scale_on_cpu_and_sessions_on_request() -> None:
    (metric,) = render(BASE).one("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    metrics = render(VARIANTS["hpa-sessions"]).one("HorizontalPodAutoscaler")["spec"]["metrics"]
    pods = [m["pods"] for m in metrics if m["type"] == "Pods"]
    assert [p["metric"]["name"] for p in pods] == ["hark_sessions_active"]
    assert render(VARIANTS["no-hpa"]).one("Deployment", "worker")["spec"]["replicas"] == 3


def test_each_worker_takes_the_udp_port_on_its_node() -> None:
    r = render(BASE)
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
    r = render(BASE)
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
    assert env["REDIS_PASSWORD"]["valueFrom"] == worker_env["HARK_REDIS_PASSWORD"]["valueFrom"]
    # The password goes apart from the URL, so it need not be URL-safe.
    assert url.password is None
    assert worker_settings(r).redis_password == KEPT_SECRETS["HARK_REDIS_PASSWORD"]
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
    assert url.scheme == "rediss" and worker_settings(r).redis_password
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
        render(merged(BASE, {"redis": {"tls": {"enabled": True}}}))


def test_workers_hop_over_tls_when_asked_each_process_on_its_port() -> None:
    assert worker_settings(render(BASE)).hop_tls_cert is None
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
        render(merged(BASE, {"hopTls": {"enabled": True}}))


def test_an_external_redis_replaces_the_charts() -> None:
    r = render(VARIANTS["external-redis"])
    assert worker_settings(r).redis_url == "redis://redis.internal:6380/2"
    assert r.all("Deployment") == [_worker(r)]
    components = {o["metadata"]["labels"].get("app.kubernetes.io/component") for o in r.objects}
    assert "redis" not in components
    secret = render(VARIANTS["redis-url-secret"])
    (ref,) = [
        v["valueFrom"]["secretKeyRef"]
        for v in _container(_worker(secret))["env"]
        if v["name"] == "HARK_REDIS_URL"
    ]
    assert ref == {"name": "fleet-redis", "key": "redis-url"}


def test_a_fleet_without_a_shared_store_does_not_render() -> None:
    with pytest.raises(HelmRenderError, match=r"redis\.url"):
        render(merged(BASE, {"redis": {"enabled": False}}))
    with pytest.raises(HelmRenderError, match=r"llm\.model"):
        render(merged(BASE, {"llm": {"urls": ["http://gpu-box:8001/v1"]}}))


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
    assert [d["metadata"]["name"] for d in render(BASE).all("Deployment")] == ["hark", "hark-redis"]
    assert worker_settings(render(BASE)).llm_url == ()


def test_chart_deploys_this_version_of_hark() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == hark.__version__
    image = _container(_worker(render(BASE)))["image"]
    assert image == f"hark:{hark.__version__}"


# -- Secrets: none generated, every one from a Secret of the user's -----------------------


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_chart_renders_identically_twice(name: str) -> None:
    # What a GitOps tool compares: a second render of the same values must not differ.
    first = render(VARIANTS[name])
    assert render(VARIANTS[name]) == first


def test_no_template_generates_a_value() -> None:
    # What would make two renders differ: random values, keys, the clock, the cluster.
    generators = re.compile(
        r"\b(randAlphaNum|randAlpha|randNumeric|randAscii|randBytes|randInt|uuidv4|"
        r"genPrivateKey|genCA|genSelfSignedCert|genSignedCert|derivePassword|now|lookup)\b"
    )
    for template in sorted((CHART / "templates").iterdir()):
        found = generators.findall(template.read_text())
        assert found == [], f"{template.name} uses {found}"


SECRET_VARIABLES = (
    "HARK_API_KEYS",
    "HARK_FLEET_SECRET",
    "HARK_REDIS_PASSWORD",
    "HARK_SIP_TRUNKS",
    "HARK_SIP_WEBHOOK_SECRET",
)


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        v["name"]: v["valueFrom"]["secretKeyRef"]
        for v in container["env"]
        if "secretKeyRef" in v.get("valueFrom", {})
    }


def test_one_existing_secret_holds_every_secret() -> None:
    values = merged(
        VARIANTS["sip-webhook-relay"],
        {"sip": {"trunks": {"enabled": True}}, "metrics": {"podMonitor": {"enabled": True}}},
    )
    r = render(values)
    assert r.all("Secret") == []
    sip = _secret_refs(_container(_sip(r)))
    assert {n: sip[n] for n in SECRET_VARIABLES} == {
        "HARK_API_KEYS": {"name": KEPT, "key": "api-keys"},
        "HARK_FLEET_SECRET": {"name": KEPT, "key": "fleet-secret"},
        "HARK_REDIS_PASSWORD": {"name": KEPT, "key": "redis-password"},
        "HARK_SIP_TRUNKS": {"name": KEPT, "key": "sip-trunks"},
        "HARK_SIP_WEBHOOK_SECRET": {"name": KEPT, "key": "sip-webhook-secret"},
    }
    worker = _secret_refs(_container(_worker(r)))
    relay = _secret_refs(_container(r.one("Deployment", "relay")))
    for name in ("HARK_API_KEYS", "HARK_FLEET_SECRET", "HARK_REDIS_PASSWORD"):
        assert worker[name] == sip[name]
    for name in ("HARK_FLEET_SECRET", "HARK_REDIS_PASSWORD"):
        assert relay[name] == sip[name]
    (monitor,) = [m for m in r.all("PodMonitor") if m["metadata"]["name"] == "hark"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": KEPT, "key": "metrics-key"}


def test_each_secret_may_name_a_secret_of_its_own() -> None:
    own = {
        "existingSecret": "",
        "apiKeys": {"existingSecret": "clients", "existingSecretKey": "keys"},
        "fleetSecret": {"existingSecret": "fleet", "existingSecretKey": "secret"},
        "redis": {"auth": {"existingSecret": "redis-auth", "existingSecretKey": "password"}},
        "sip": {
            "trunks": {"existingSecret": "trunks", "existingSecretKey": "json"},
            "webhook": {
                "url": "https://backend.example/sip",
                "existingSecret": "webhook",
                "existingSecretKey": "whsec",
            },
        },
        "metrics": {
            "podMonitor": {"enabled": True, "keySecret": "prometheus", "keySecretKey": "key"}
        },
    }
    r = render(merged(VARIANTS["sip"], own))
    assert r.all("Secret") == []
    refs = _secret_refs(_container(_sip(r)))
    assert {n: refs[n] for n in SECRET_VARIABLES} == {
        "HARK_API_KEYS": {"name": "clients", "key": "keys"},
        "HARK_FLEET_SECRET": {"name": "fleet", "key": "secret"},
        "HARK_REDIS_PASSWORD": {"name": "redis-auth", "key": "password"},
        "HARK_SIP_TRUNKS": {"name": "trunks", "key": "json"},
        "HARK_SIP_WEBHOOK_SECRET": {"name": "webhook", "key": "whsec"},
    }
    redis_env = _secret_refs(_container(r.one("Deployment", "redis")))
    assert redis_env["REDIS_PASSWORD"] == {"name": "redis-auth", "key": "password"}
    (endpoint,) = r.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "prometheus", "key": "key"}
    settings = load_settings(env=sip_environment(r))
    assert settings.sip_webhook_secret == WEBHOOK_SECRET
    assert [t.name for t in settings.sip_trunks] == ["pbx"]


def test_secrets_given_inline_go_into_the_charts_secret() -> None:
    r = render(VARIANTS["inline-secrets"])
    (secret,) = r.all("Secret")
    assert secret["metadata"]["name"] == INLINE
    assert sorted(secret["data"]) == ["api-keys", "fleet-secret", "redis-password"]
    settings = worker_settings(r)
    assert settings.api_keys == ("sk-inline",)
    assert settings.fleet_secret == "an-inline-fleet-secret-of-some-length"
    assert settings.redis_password == "inline-redis-password"
    # A new value rolls the workers; the same values leave the pods as they are.
    annotation = "checksum/secret"
    before = _worker(r)["spec"]["template"]["metadata"]["annotations"][annotation]
    rotated = merged(VARIANTS["inline-secrets"], {"apiKeys": {"keys": ["sk-rotated"]}})
    after = _worker(render(rotated))["spec"]["template"]["metadata"]["annotations"][annotation]
    assert before != after
    # No secret ever appears as a plain value in a pod's spec.
    for deployment in r.all("Deployment"):
        text = json.dumps(_pod(deployment))
        for plain in ("sk-inline", "an-inline-fleet-secret", "inline-redis-password"):
            assert plain not in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, r"no API keys"),
        ({"apiKeys": {"keys": ["sk-one"]}}, r"no fleet secret"),
        (
            {"apiKeys": {"keys": ["sk-one"]}, "fleetSecret": {"value": "x" * 32}},
            r"no Redis password",
        ),
        (
            {"apiKeys": {"keys": ["sk-one"]}, "fleetSecret": {"value": "too-short"}},
            r"at least 16 bytes",
        ),
        (merged(BASE, {"sip": {"enabled": True, "trunks": {"enabled": False}}}), r"who may call"),
        (merged(BASE, {"sip": {"enabled": True}}), r"networkPolicy\.nodePeers"),
        (
            merged(SIP, {"sip": {"trunks": {"enabled": False}, "webhook": {"url": "https://x"}}}),
            r"no API keys",
        ),
        (merged(BASE, {"metrics": {"podMonitor": {"enabled": True, "keySecret": ""}}}), None),
    ],
)
def test_missing_secrets_do_not_render(values: dict[str, Any], message: str | None) -> None:
    if message is None:
        # The release-wide Secret stands in for the one not named.
        render(values)
        return
    with pytest.raises(HelmRenderError, match=message):
        render(values)


# -- WebRTC through the relay, or per-node addresses without it -----------------------------


def test_the_relay_carries_the_workers_media() -> None:
    from hark.config.relay import configure_parser

    r = render(VARIANTS["relay-workers"])
    relay = r.one("Deployment", "relay")
    container = _container(relay)
    assert container["command"] == ["hark"] and container["args"][0] == "relay"
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    options = parser.parse_args(container["args"][1:])
    assert int(options.workers) == 2
    listen_port = int(options.listen.rpartition(":")[2])
    metrics_port = int(options.metrics_listen.rpartition(":")[2])
    # The one public UDP port: a LoadBalancer that keeps the client's address.
    service = r.one("Service", "relay")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    (port,) = service["spec"]["ports"]
    assert port["protocol"] == "UDP" and port["port"] == 3478
    assert _port(container, port["targetPort"])["containerPort"] == listen_port
    # The store and the fleet secret from the environment, as the workers have them.
    env = environment(r, container)
    assert "--fleet-secret" not in container["args"] and "--redis-url" not in container["args"]
    workers = worker_settings(r)
    assert env["HARK_REDIS_URL"] == workers.redis_url
    assert env["HARK_FLEET_SECRET"] == workers.fleet_secret
    # Its metrics, scraped and probed on the port it serves them on.
    assert _port(container, "metrics")["containerPort"] == metrics_port
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    # The workers advertise the relay and their pod address, which the relay reaches, and
    # take no port on their node.
    assert workers.relay_address == "203.0.113.5:3478"
    assert workers.rtc_advertise_ip == POD_IP
    udp = [p for p in _container(_worker(r))["ports"] if p["protocol"] == "UDP"]
    assert len(udp) == 3 and not any("hostPort" in p for p in udp)
    # Disruptions take one relay at a time.
    pdb = r.one("PodDisruptionBudget", "relay")
    assert _pods_selected(r, pdb["spec"]["selector"]["matchLabels"]) == [relay]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_only_the_relays_send_the_workers_media_when_there_are_relays() -> None:
    for name, media_from in (("relay-workers", "relay"), ("workers", None)):
        r = render(VARIANTS[name])
        policy = r.one("NetworkPolicy", "worker")
        assert _pods_selected(r, policy["spec"]["podSelector"]["matchLabels"]) == [_worker(r)]
        rules = policy["spec"]["ingress"]
        http = [
            rule for rule in rules if {"port": "http", "protocol": "TCP"} in rule.get("ports", [])
        ]
        assert http and "from" not in http[0], "the API is for any client"
        settings = worker_settings(r)
        ports = [process_settings(settings, i).rtc_port for i in range(settings.workers)]
        (media,) = [rule for rule in rules if rule.get("ports", [{}])[0].get("protocol") == "UDP"]
        assert [p["port"] for p in media["ports"]] == ports
        if media_from is None:
            assert "from" not in media
        else:
            (source,) = media["from"]
            assert _pods_selected(r, source["podSelector"]["matchLabels"]) == [
                r.one("Deployment", media_from)
            ]
        # Everything else (each process's internal port, TLS hops) from the fleet only.
        (internal,) = [rule for rule in rules if "ports" not in rule]
        assert [_pods_selected(r, s["podSelector"]["matchLabels"]) for s in internal["from"]] == [
            [_worker(r)]
        ]
    # The relays reach Redis.
    r = render(VARIANTS["relay"])
    (rule,) = r.one("NetworkPolicy", "redis")["spec"]["ingress"]
    sources = [_pods_selected(r, s["podSelector"]["matchLabels"]) for s in rule["from"]]
    assert sources == [[_worker(r)], [r.one("Deployment", "relay")]]


def test_a_relay_needs_its_public_address() -> None:
    with pytest.raises(HelmRenderError, match=r"relay\.publicIP"):
        render(merged(BASE, {"relay": {"enabled": True}}))
    with pytest.raises(HelmRenderError, match=r"relay\.publicIP"):
        render(merged(BASE, {"relay": {"enabled": True, "publicIP": "relay.example.com"}}))
    with pytest.raises(HelmRenderError, match=r"media\.enabled"):
        render(merged(VARIANTS["relay"], {"media": {"enabled": False}}))


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "ca.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """The Kubernetes API's GET /api/v1/nodes/NAME, for one token."""

    nodes: ClassVar[dict[str, list[dict[str, str]]]] = {}

    def do_GET(self) -> None:
        name = self.path.removeprefix("/api/v1/nodes/")
        if self.headers.get("Authorization") != "Bearer a-projected-token":
            self.send_response(401)
            self.end_headers()
            return
        if name not in self.nodes:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"status": {"addresses": self.nodes[name]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_each_pod_advertises_its_nodes_external_address(tmp_path: Path) -> None:
    r = render(VARIANTS["sip-external-ip"])
    pods = {"worker": _worker(r), "sip": _sip(r)}
    cert, key = _self_signed(tmp_path)
    (tmp_path / "token").write_text("a-projected-token\n")
    _FakeApi.nodes = {
        "node-a": [
            {"type": "InternalIP", "address": "10.0.0.4"},
            {"type": "ExternalIP", "address": "2001:db8::4"},
            {"type": "ExternalIP", "address": EXTERNAL_IP},
        ],
        "node-b": [{"type": "InternalIP", "address": "10.0.0.5"}],
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for component, deployment in pods.items():
            pod = _pod(deployment)
            (init,) = pod["initContainers"]
            env = environment(r, init)
            # Only the init container gets a token: a short-lived one, with the CA.
            mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
            assert env["HARK_NODE_ACCOUNT_DIR"] == mounts["node-account"]
            (account,) = [v for v in pod["volumes"] if v["name"] == "node-account"]
            sources = account["projected"]["sources"]
            assert sources[0]["serviceAccountToken"]["path"] == "token"
            assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
            for container in pod["containers"]:
                assert "node-account" not in {m["name"] for m in container["volumeMounts"]}
            written = tmp_path / f"{component}.toml"
            env |= {
                "HARK_NODE_ACCOUNT_DIR": str(tmp_path),
                "HARK_NODE_CONFIG": str(written),
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(server.server_address[1]),
            }
            run = subprocess.run(
                [sys.executable, *init["command"][1:]], env=env, capture_output=True, text=True
            )
            assert run.returncode == 0, run.stderr
            # The file is where hark reads it (HARK_CONFIG), on a volume the two share.
            hark = _container(deployment)
            config = environment(r, hark, pod_ip=NODE_IP)["HARK_CONFIG"]
            (mount,) = [m for m in hark["volumeMounts"] if m["name"] == "node-address"]
            assert config == env["HARK_NODE_CONFIG"].replace(str(written), NODE_CONFIG)
            assert config.startswith(mounts["node-address"] + "/")
            assert config.startswith(mount["mountPath"] + "/")
            hark_env = environment(r, hark, pod_ip=NODE_IP) | {"HARK_CONFIG": str(written)}
            settings = load_settings(env=hark_env)
            assert settings.rtc_advertise_ip == EXTERNAL_IP
            if component == "sip":
                assert settings.sip_advertise_ip == EXTERNAL_IP
            # A node without an ExternalIP stops the pod with a reason, not a wrong address.
            run = subprocess.run(
                [sys.executable, *init["command"][1:]],
                env=env | {"NODE_NAME": "node-b"},
                capture_output=True,
                text=True,
            )
            assert run.returncode != 0 and "no IPv4 ExternalIP" in run.stderr
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    # The token reads nodes and nothing else, bound to the pods' service account.
    (role,) = r.all("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    (binding,) = r.all("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": _pod(_worker(r))["serviceAccountName"],
            "namespace": NAMESPACE,
        }
    ]
    # Without it, no role at all.
    assert render(BASE).all("ClusterRole") == []
    assert render(VARIANTS["relay"]).all("ClusterRole") == []


# -- SIP ---------------------------------------------------------------------------------


def test_sip_is_off_unless_asked() -> None:
    r = render(BASE)
    assert not worker_settings(r).sip
    assert [d for d in r.all("Deployment") if d["metadata"]["name"].endswith("-sip")] == []
    assert not worker_settings(render(VARIANTS["sip"])).sip


def test_the_sip_pods_take_their_nodes_ports() -> None:
    r = render(VARIANTS["sip"])
    sip = _sip(r)
    pod = _pod(sip)
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    container = _container(sip)
    settings = load_settings(env=sip_environment(r))
    assert settings.sip
    assert settings.sip_host == "0.0.0.0"
    # HTTP and WebRTC on the node's own address, clear of the workers' ports.
    assert settings.host == NODE_IP
    assert settings.advertise_url == f"http://{NODE_IP}:{settings.port}"
    assert _port(container, "http")["containerPort"] == settings.port != DEFAULTS.port
    assert settings.rtc_port != DEFAULTS.rtc_port
    for name, protocol in (("sip-udp", "UDP"), ("sip-tcp", "TCP")):
        port = _port(container, name)
        assert port["containerPort"] == settings.sip_port == 5060
        assert port["protocol"] == protocol
    assert settings.rtp_ports == (10000, 20000)
    assert settings.sip_advertise_ip == NODE_IP
    assert [t.name for t in settings.sip_trunks] == ["pbx"]
    assert settings.drain_timeout == worker_settings(r).drain_timeout
    assert pod["terminationGracePeriodSeconds"] == _pod(_worker(r))["terminationGracePeriodSeconds"]
    # A webhook instead of trunks, a fixed address, behind the relay.
    r = render(VARIANTS["sip-webhook-relay"])
    settings = load_settings(env=sip_environment(r))
    assert settings.sip_trunks == ()
    assert settings.sip_webhook_url == "https://backend.example/sip"
    assert settings.sip_webhook_secret == WEBHOOK_SECRET
    assert settings.sip_advertise_ip == "198.51.100.7"
    # Browser calls placed on a SIP pod: through the relay, or at the phones' address.
    assert settings.relay_address == "203.0.113.5:3478"
    assert settings.rtc_advertise_ip == NODE_IP
    settings = load_settings(env=sip_environment(render(VARIANTS["sip"])))
    assert settings.relay_address is None
    assert settings.rtc_advertise_ip == settings.sip_advertise_ip == NODE_IP


def test_hostnetwork_sip_pods_reach_redis_and_the_workers_from_the_nodes() -> None:
    r = render(merged(VARIANTS["sip"], {"vllm": {"enabled": True}}))
    for component in ("redis", "vllm"):
        (rule,) = r.one("NetworkPolicy", component)["spec"]["ingress"]
        assert NODES[0] in rule["from"]
    (internal,) = [
        i for i in r.one("NetworkPolicy", "worker")["spec"]["ingress"] if "ports" not in i
    ]
    assert NODES[0] in internal["from"]


# -- Rollouts ------------------------------------------------------------------------------


def test_rollouts_take_their_pace_from_the_values() -> None:
    strategy = _worker(render(BASE))["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}
    r = render(VARIANTS["rollout"])
    assert _worker(r)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": "25%",
        "maxUnavailable": 1,
    }
    assert _pod(_worker(r))["terminationGracePeriodSeconds"] == 300
    with pytest.raises(HelmRenderError, match=r"terminationGracePeriodSeconds must be at least 80"):
        render(merged(BASE, {"hark": {"terminationGracePeriodSeconds": 79}}))


def test_the_telephony_profile_lets_calls_finish() -> None:
    profile = yaml.safe_load((CHART / "values-telephony.yaml").read_text())
    r = render(merged(BASE, SIP, profile))
    for deployment in (_worker(r), _sip(r)):
        env = environment(r, _container(deployment), pod_ip=NODE_IP)
        drain = load_settings(env=env).drain_timeout
        assert drain >= 15 * 60
        assert _pod(deployment)["terminationGracePeriodSeconds"] >= drain
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hpa = r.one("HorizontalPodAutoscaler")["spec"]["behavior"]["scaleDown"]
    assert hpa["stabilizationWindowSeconds"] >= 15 * 60
    assert hpa["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 600}]


# -- Redis ---------------------------------------------------------------------------------


def test_redis_has_a_disruption_budget() -> None:
    r = render(BASE)
    pdb = r.one("PodDisruptionBudget", "redis")
    assert _pods_selected(r, pdb["spec"]["selector"]["matchLabels"]) == [
        r.one("Deployment", "redis")
    ]
    assert pdb["spec"]["maxUnavailable"] == 0


def test_an_external_redis_may_speak_tls() -> None:
    r = render(merged(BASE, {"redis": {"enabled": False, "url": "rediss://redis.example:6380/0"}}))
    assert worker_settings(r).redis_url == "rediss://redis.example:6380/0"


def test_redis_acl_user_holds_only_harks_keys(tmp_path: Path) -> None:
    import redis

    r = render(VARIANTS["redis-acl"])
    settings = worker_settings(r)
    assert urlsplit(settings.redis_url or "").username == "hark"
    assert settings.redis_password == KEPT_SECRETS["HARK_REDIS_PASSWORD"]
    # What the store connects with: the URL with the password put in.
    url = urlsplit(with_password(settings.redis_url or "", settings.redis_password))
    assert url.password is not None
    password = unquote(url.password)
    container = _container(r.one("Deployment", "redis"))
    env = environment(r, container)
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[probe.index("--user") + 1] == "hark"
    assert env["REDISCLI_AUTH"] == password
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--dir", str(tmp_path), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, username=url.username, password=password)
        for _ in range(300):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        client.set("hark:worker:a", b"1", px=4000)
        assert (
            client.register_script("return redis.call('GET', KEYS[1])")(["hark:worker:a"]) == b"1"
        )
        assert sorted(client.scan_iter(match="hark:*")) == [b"hark:worker:a"]
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("elsewhere", b"1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.config_get("requirepass")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
        default = redis.Redis(host="127.0.0.1", port=port, password=password)
        with pytest.raises(redis.exceptions.AuthenticationError):
            default.ping()
    finally:
        server.terminate()
        server.wait()


# -- Autoscaling -----------------------------------------------------------------------------


def _sessions_target(values: dict[str, Any]) -> int:
    metrics = render(merged(values, {"autoscaling": {"sessions": {"enabled": True}}}))
    (pods,) = [
        m["pods"]
        for m in metrics.one("HorizontalPodAutoscaler")["spec"]["metrics"]
        if m["type"] == "Pods"
    ]
    return int(pods["target"]["averageValue"])


def test_the_sessions_target_follows_the_engines_and_the_cpu() -> None:
    # 1.5 a core with the embedded models, 3 with the LLM elsewhere, 30 a process with
    # everything elsewhere (docs/deployment.md, Autoscaling).
    assert _sessions_target(BASE) == 3
    assert _sessions_target(merged(BASE, {"resources": {"requests": {"cpu": "1500m"}}})) == 2
    assert _sessions_target(merged(BASE, {"resources": {"requests": {"cpu": 8}}})) == 12
    remote_llm = {"llm": {"urls": ["http://gpu-box:8001/v1"], "model": "qwen"}}
    assert _sessions_target(merged(BASE, remote_llm)) == 6
    assert _sessions_target(VARIANTS["remote-speech"]) == 30
    assert _sessions_target(merged(VARIANTS["remote-speech"], {"hark": {"workers": 4}})) == 60
    assert _sessions_target(merged(BASE, {"hark": {"engines": "fake"}})) == 30
    assert (
        _sessions_target(merged(BASE, {"autoscaling": {"sessions": {"averagePerPod": "7"}}})) == 7
    )
    settings = worker_settings(render(VARIANTS["remote-speech"]))
    assert settings.asr_url == "http://gpu-box:8002/v1"
    assert settings.tts_url == "http://gpu-box:8003/v1"


# -- Monitoring ------------------------------------------------------------------------------


_SERIES = re.compile(r"\b(hark_[a-z0-9_]+)")


def test_pod_monitors_scrape_the_ports_that_serve_metrics() -> None:
    r = render(merged(VARIANTS["monitoring"], SIP))
    for monitor in r.all("PodMonitor"):
        selector = monitor["spec"]["selector"]
        pods = [
            d
            for d in r.all("Deployment")
            if _selects(
                selector["matchLabels"], labels := d["spec"]["template"]["metadata"]["labels"]
            )
            and all(
                labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
            )
        ]
        assert pods
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        for deployment in pods:
            _port(_container(deployment), endpoint["port"])
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    names = sorted(
        c["metadata"]["labels"]["app.kubernetes.io/component"]
        for m in r.all("PodMonitor")
        for c in [m]
    )
    assert names == ["relay", "worker"]


def test_alert_rules_watch_series_that_exist() -> None:
    r = render(VARIANTS["monitoring"])
    (rule,) = r.all("PrometheusRule")
    alerts = {a["alert"]: a for g in rule["spec"]["groups"] for a in g["rules"]}
    assert set(alerts) == {
        "HarkWorkerNotReady",
        "HarkEngineThreadRestarts",
        "HarkLateAudio",
        "HarkVadFallingBehind",
        "HarkStoreDown",
        "HarkRelayDrops",
    }
    known = known_series()
    for alert in alerts.values():
        for series in _SERIES.findall(alert["expr"]):
            assert series in known, f"{alert['alert']}: {series} is not a series hark exposes"
        assert f'namespace="{NAMESPACE}"' in alert["expr"]
    from hark.edge.relay import DROP_REASONS

    reasons = re.search(r'reason=~"([^"]+)"', alerts["HarkRelayDrops"]["expr"])
    assert reasons and set(reasons[1].split("|")) <= set(DROP_REASONS)
    assert render(VARIANTS["relay"]).all("PrometheusRule") == []


def test_the_dashboard_filters_every_panel_and_shows_what_exists() -> None:
    dashboard = json.loads((CHART.parents[1] / "grafana" / "hark-dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"namespace", "pod", "instance"} <= set(variables)
    known = known_series()
    exprs = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("relay", "sip", "engine thread restarts"):
        assert subject in titles
    for title, expr in exprs:
        for series in _SERIES.findall(expr):
            assert series in known, f"{title}: {series} is not a series hark exposes"
        for selector in re.findall(r"\bhark_[a-z0-9_]+(\{[^}]*\})?", expr):
            assert 'namespace=~"$namespace"' in selector, f"{title}: {expr}"
    # Each variable narrows the next.
    assert "$namespace" in json.dumps(variables["pod"])
    assert "$pod" in json.dumps(variables["instance"])


def test_every_new_value_reaches_what_it_sets() -> None:
    from hark.config.relay import configure_parser

    values = merged(
        BASE,
        SIP,
        {
            "relay": {
                "enabled": True,
                "publicIP": "203.0.113.5",
                "port": 3480,
                "metricsPort": 9500,
                "flowIdleSeconds": 45,
                "sourceFlowRate": 7,
                "sourceFlowBurst": 30,
                "logLevel": "warning",
                "service": {
                    "loadBalancerIP": "203.0.113.5",
                    "loadBalancerSourceRanges": ["198.51.100.0/24"],
                    "annotations": {"cloud.example/eip": "eip-1"},
                },
                "nodeSelector": {"pool": "edge"},
                "affinity": {"nodeAffinity": {}},
            },
            "sip": {
                "port": 5080,
                "rtpPorts": "30000-30999",
                "httpPort": 8200,
                "rtcPort": 8600,
                "session": json.dumps({"instructions": "Answer the phone."}),
                "maxCalls": 40,
                "workers": 2,
                "nodeSelector": {"pool": "sip"},
            },
            "llm": {"urls": ["http://gpu-box:8001/v1"], "model": "qwen"},
            "speech": {
                "asrUrl": "http://gpu-box:8002/v1",
                "asrModel": "whisper-large-v3",
                "ttsUrl": "http://gpu-box:8003/v1",
                "ttsModel": "kokoro",
                "apiKeySecret": "speech",
            },
            "metrics": {
                "podMonitor": {"enabled": True, "interval": "15s", "labels": {"team": "voice"}},
                "prometheusRule": {
                    "enabled": True,
                    "labels": {"release": "prom"},
                    "lateAudioPerSecond": 9,
                    "lateVadRatio": 0.05,
                },
            },
        },
    )
    r = render(values)
    assert [e for obj in r.objects for e in check_object(obj)] == []
    relay = r.one("Deployment", "relay")
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    options = parser.parse_args(_container(relay)["args"][1:])
    assert (options.listen, options.metrics_listen) == ("0.0.0.0:3480", "0.0.0.0:9500")
    assert (float(options.flow_idle), float(options.source_flow_rate)) == (45, 7)
    assert (int(options.source_flow_burst), options.log_level) == (30, "warning")
    assert _pod(relay)["nodeSelector"] == {"pool": "edge"}
    assert _pod(relay)["affinity"] == {"nodeAffinity": {}}
    service = r.one("Service", "relay")
    assert service["spec"]["loadBalancerIP"] == "203.0.113.5"
    assert service["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    assert service["metadata"]["annotations"] == {"cloud.example/eip": "eip-1"}
    assert worker_settings(r).relay_address == "203.0.113.5:3480"
    sip = load_settings(env=sip_environment(r))
    assert (sip.sip_port, sip.rtp_ports, sip.port, sip.rtc_port) == (
        5080,
        (30000, 30999),
        8200,
        8600,
    )
    assert sip.sip_session is not None and "Answer the phone." in str(sip.sip_session)
    assert (sip.sip_max_calls, sip.workers) == (40, 2)
    assert _pod(_sip(r))["nodeSelector"] == {"pool": "sip"}
    worker = worker_settings(r)
    assert (worker.asr_model, worker.tts_model) == ("whisper-large-v3", "kokoro")
    refs = _secret_refs(_container(_worker(r)))
    assert (
        refs["HARK_ASR_API_KEY"] == refs["HARK_TTS_API_KEY"] == {"name": "speech", "key": "api-key"}
    )
    for monitor in r.all("PodMonitor"):
        assert monitor["metadata"]["labels"]["team"] == "voice"
        assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
    rule = r.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    exprs = {a["alert"]: a["expr"] for g in rule["spec"]["groups"] for a in g["rules"]}
    assert exprs["HarkLateAudio"].endswith("> 9")
    assert exprs["HarkVadFallingBehind"].endswith("> 0.05")


def test_relays_check_redis_tls_as_the_workers_do() -> None:
    r = render(merged(VARIANTS["redis-tls"], RELAY))
    for deployment in (_worker(r), r.one("Deployment", "relay")):
        url = urlsplit(environment(r, _container(deployment))["HARK_REDIS_URL"])
        assert url.scheme == "rediss"
        ca = dict(p.split("=", 1) for p in url.query.split("&"))["ssl_ca_certs"]
        (mount,) = [
            m for m in _container(deployment)["volumeMounts"] if ca.startswith(m["mountPath"] + "/")
        ]
        (volume,) = [v for v in _pod(deployment)["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "redis-cert"


def test_an_external_redis_behind_sentinel_gets_its_password_apart() -> None:
    r = render(merged(VARIANTS["redis-sentinel"], RELAY))
    settings = worker_settings(r)
    assert settings.redis_url == "redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster"
    assert settings.redis_password == KEPT_SECRETS["HARK_REDIS_PASSWORD"]
    relay = environment(r, _container(r.one("Deployment", "relay")))
    assert relay["HARK_REDIS_URL"] == settings.redis_url
    assert relay["HARK_REDIS_PASSWORD"] == settings.redis_password
    assert [d["metadata"]["name"] for d in r.all("Deployment")] == ["hark", "hark-relay"]
    # Without redis.auth.external an external URL carries its own password, if any.
    assert worker_settings(render(VARIANTS["external-redis"])).redis_password is None
