"""The Helm chart rendered for ``podman kube play`` (scripts/container-test kube).

Renders deploy/helm/hark with Helm's Go SDK (tests/deploy/chart.py) and writes one Pod
manifest per Deployment (``<dir>/<component>.yaml``), with what podman 4.3 cannot express
substituted, each substitution being what a cluster would do:

- a Deployment becomes one Pod with its template's spec (one replica each);
- ``secretKeyRef`` becomes the value of that key in the rendered Secret, or in a Secret the
  operator made (``--secret NAME/KEY=VALUE``, as ``kubectl create secret`` would): podman's
  secrets are not Kubernetes Secrets;
- ``fieldRef`` ``status.podIP`` and ``status.hostIP`` become the pod's address (given with
  ``--ip``) and the test host's address on the pods' network;
- a pod on ``hostNetwork`` (the SIP pods) gets an address of its own on the pods' network
  instead, which then stands for its node's: ``status.hostIP`` is that address too (podman
  would otherwise put it in the test host's own network, with SIP open on every address);
- ``$(VAR)`` in values, args and commands is expanded from the container's environment, as
  the kubelet does;
- a Service's name reaches its pod through ``hostAliases`` (podman has no Services);
- images become the locally built ones (``--image hark=…``, ``--image redis=…``).

HPA, PodDisruptionBudget, NetworkPolicy, ServiceAccount, Service and Secret objects are
dropped (podman plays pods). Prints a JSON map of component to pod name, address and file.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.deploy.chart import render

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m[1], m[0]), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", required=True, help="chart values, JSON")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--host-ip", required=True, help="the test host on the pods' network")
    parser.add_argument(
        "--pod-ip", action="append", default=[], help="COMPONENT=ADDRESS, one per Deployment"
    )
    parser.add_argument("--image", action="append", default=[], help="CONTAINER=IMAGE")
    parser.add_argument(
        "--secret", action="append", default=[], help="NAME/KEY=VALUE, a Secret made apart"
    )
    args = parser.parse_args()
    pod_ips = dict(p.split("=", 1) for p in args.pod_ip)
    images = dict(i.split("=", 1) for i in args.image)
    rendered = render(json.loads(args.values))
    secrets: dict[tuple[str, str], str] = {}
    for item in args.secret:
        ref, _, value = item.partition("=")
        name, _, key = ref.partition("/")
        secrets[name, key] = value
    for secret in rendered.all("Secret"):
        name = secret["metadata"]["name"]
        for key, value in (secret.get("data") or {}).items():
            secrets[name, key] = base64.b64decode(value).decode()
        for key, value in (secret.get("stringData") or {}).items():
            secrets[name, key] = value
    pods: dict[str, dict[str, Any]] = {}
    for deployment in rendered.all("Deployment"):
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        pods[component] = deployment
    missing = set(pods) - set(pod_ips)
    assert not missing, f"no --pod-ip for {sorted(missing)}"
    # A Service reaches the pods its selector matches: here the one pod of that component.
    aliases: dict[str, list[str]] = {}
    for service in rendered.all("Service"):
        component = service["spec"]["selector"].get("app.kubernetes.io/component")
        if component in pods:
            name = service["metadata"]["name"]
            aliases.setdefault(pod_ips[component], []).extend(
                [name, f"{name}.{rendered_namespace(service)}.svc.cluster.local"]
            )
    args.out.mkdir(parents=True, exist_ok=True)
    played: dict[str, dict[str, str]] = {}
    for component, deployment in pods.items():
        spec = deployment["spec"]["template"]["spec"]
        pod_ip = pod_ips[component]
        # On hostNetwork the pod's address is its node's.
        host_ip = pod_ip if spec.pop("hostNetwork", False) else args.host_ip
        if spec.get("dnsPolicy") == "ClusterFirstWithHostNet":
            del spec["dnsPolicy"]
        for container in spec["containers"]:
            env: dict[str, str] = {}
            for var in container.get("env", []):
                source = var.pop("valueFrom", None)
                if source and "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    var["value"] = secrets[ref["name"], ref["key"]]
                elif source and "fieldRef" in source:
                    field = source["fieldRef"]["fieldPath"]
                    var["value"] = {"status.podIP": pod_ip, "status.hostIP": host_ip}[field]
                elif source:
                    raise SystemExit(f"{component}: cannot substitute {source}")
                var["value"] = _expand(var["value"], env)
                env[var["name"]] = var["value"]
            for key in ("args", "command"):
                if key in container:
                    container[key] = [_expand(a, env) for a in container[key]]
            if container["name"] in images:
                container["image"] = images[container["name"]]
                container["imagePullPolicy"] = "Never"
        spec["hostAliases"] = [
            {"ip": ip, "hostnames": names} for ip, names in aliases.items() if ip != pod_ip
        ]
        name = deployment["metadata"]["name"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": deployment["spec"]["template"]["metadata"]["labels"],
            },
            "spec": spec,
        }
        path = args.out / f"{component}.yaml"
        path.write_text(yaml.safe_dump(pod, sort_keys=False))
        path.chmod(0o600)
        played[component] = {"pod": name, "ip": pod_ip, "file": str(path)}
    print(json.dumps(played))
    return 0


def spec_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def rendered_namespace(obj: dict[str, Any]) -> str:
    return obj["metadata"].get("namespace", "default")


if __name__ == "__main__":
    sys.exit(main())
