"""Rendering the Helm chart offline and checking what it makes against Kubernetes' own models.

The chart is rendered by Helm itself (its Go SDK, through ``helm_python``), exactly as
``helm template`` would. Every object is then checked against the official ``kubernetes``
client: its apiVersion and kind must name a resource the client's API for that group and
version can create, every field must be one the model knows (recursively, with its type),
and the model must build from it (required fields).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import yaml

try:
    import helm_python
    from helm_python import HelmRenderError as HelmRenderError
except ImportError as exc:  # pragma: no cover - says what to install instead of a bare error
    raise ImportError(
        "the Helm renderer is missing: helm-python-sdk (Helm's Go SDK as a Python package) "
        "belongs in pyproject.toml's dev group; run `uv sync` after adding it"
    ) from exc

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "hark"
RELEASE = "hark"
NAMESPACE = "voice"

_LIST = re.compile(r"^[Ll]ist\[(.+)\]$")
_DICT = re.compile(r"^(?:[Dd]ict\[str, (.+)\]|dict\(str, (.+)\))$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    # A Secret's data: base64 text in a manifest.
    "bytes": (str,),
    "bytearray": (str,),
}


@dataclass(frozen=True)
class Rendered:
    """One rendering: the objects, in template order, and the NOTES.txt text."""

    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind``."""
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict[str, Any]:
        """The one object of ``kind`` (of ``component``, by its app.kubernetes.io label)."""
        found = [
            o
            for o in self.all(kind)
            if component is None
            or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
        return found[0]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        """The object of ``kind`` called ``name``."""
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
        return found[0]


def render(values: dict[str, Any] | None = None) -> Rendered:
    """The chart rendered with ``values`` over its defaults, as a fresh install."""
    with helm_python.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                objects.append(doc)
    return Rendered(objects, notes)


def lint(values: dict[str, Any]) -> dict[str, Any]:
    """``helm lint --strict`` of the chart with ``values``: its errors and messages."""
    return helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE)


def _api_class_name(api_version: str) -> str:
    group, _, version = api_version.rpartition("/")
    if not group:
        return f"Core{version.capitalize()}Api"
    words = group.removesuffix(".k8s.io").split(".")
    return "".join(w.capitalize() for w in words) + version.capitalize() + "Api"


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def model_class(api_version: str, kind: str) -> str:
    """The client's model class for ``apiVersion``/``kind`` (``apps/v1``, ``Deployment`` →
    ``V1Deployment``), after checking that the API of that group and version can create it."""
    api = getattr(k8s, _api_class_name(api_version), None)
    assert api is not None, f"no Kubernetes API for {api_version}"
    creates = {f"create_namespaced_{_snake(kind)}", f"create_{_snake(kind)}"}
    assert creates & set(dir(api)), f"{api_version} has no kind {kind}"
    name = api_version.rpartition("/")[2].capitalize() + kind
    assert hasattr(k8s, name), f"the client has no model {name}"
    return name


def unknown_fields(value: Any, type_name: str, path: str = "") -> list[str]:
    """Where ``value`` does not fit the client's type ``type_name``: fields the model does
    not have, or values of the wrong type. Empty when it fits."""
    if value is None:
        return []
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in unknown_fields(v, m[1], f"{path}[{i}]")]
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {type(value).__name__}"]
        inner = m[1] or m[2]
        return [e for k, v in value.items() for e in unknown_fields(v, inner, f"{path}.{k}")]
    if type_name == "object":
        return []
    if type_name in _PRIMITIVES:
        expected = _PRIMITIVES[type_name]
        # YAML's true is not an int, and 8000 is not the string Kubernetes wants.
        if isinstance(value, bool) and bool not in expected:
            return [f"{path}: expected {type_name}, got bool"]
        if not isinstance(value, expected):
            return [f"{path}: expected {type_name}, got {type(value).__name__} {value!r}"]
        return []
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected {type_name}, got {type(value).__name__}"]
    by_json = {json: attr for attr, json in model.attribute_map.items()}
    errors = [f"{path}.{key}: not a field of {type_name}" for key in value if key not in by_json]
    for key, item in value.items():
        if key in by_json:
            errors += unknown_fields(item, model.openapi_types[by_json[key]], f"{path}.{key}")
    return errors


# The Prometheus operator's kinds (monitoring.coreos.com/v1), which the client has no models
# for: the fields of their CRDs the chart may use, with their types ("str", "int", "map":
# any string map, a dict: an object with those fields, a one-item list: a list of them).
# Written from the operator's API reference; a field not listed is an error, as for the
# client's models.
_SELECTOR = {
    "matchLabels": "map",
    "matchExpressions": [{"key": "str", "operator": "str", "values": ["str"]}],
}
_METADATA = {"name": "str", "namespace": "str", "labels": "map", "annotations": "map"}
_MONITORING: dict[str, dict[str, Any]] = {
    "PodMonitor": {
        "apiVersion": "str",
        "kind": "str",
        "metadata": _METADATA,
        "spec": {
            "jobLabel": "str",
            "namespaceSelector": {"any": "bool", "matchNames": ["str"]},
            "selector": _SELECTOR,
            "podMetricsEndpoints": [
                {
                    "port": "str",
                    "path": "str",
                    "scheme": "str",
                    "interval": "str",
                    "scrapeTimeout": "str",
                    "authorization": {
                        "type": "str",
                        "credentials": {"name": "str", "key": "str", "optional": "bool"},
                    },
                }
            ],
        },
    },
    "PrometheusRule": {
        "apiVersion": "str",
        "kind": "str",
        "metadata": _METADATA,
        "spec": {
            "groups": [
                {
                    "name": "str",
                    "interval": "str",
                    "rules": [
                        {
                            "alert": "str",
                            "record": "str",
                            "expr": "str",
                            "for": "str",
                            "labels": "map",
                            "annotations": "map",
                        }
                    ],
                }
            ]
        },
    },
}
_REQUIRED = {"PodMonitor": ("spec.selector", "spec.podMetricsEndpoints"), "PrometheusRule": ()}


def _schema_errors(value: Any, schema: Any, path: str) -> list[str]:
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [
            e for i, v in enumerate(value) for e in _schema_errors(v, schema[0], f"{path}[{i}]")
        ]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        errors = [f"{path}.{k}: not a field" for k in value if k not in schema]
        return errors + [
            e
            for k, v in value.items()
            if k in schema
            for e in _schema_errors(v, schema[k], f"{path}.{k}")
        ]
    if schema == "map":
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return [] if ok else [f"{path}: expected a map of strings"]
    expected = {"str": str, "int": int, "bool": bool}[schema]
    ok = isinstance(value, expected) and (schema == "bool" or not isinstance(value, bool))
    return [] if ok else [f"{path}: expected {schema}, got {value!r}"]


def _check_monitoring(obj: dict[str, Any], where: str) -> list[str]:
    kind = obj["kind"]
    if obj["apiVersion"] != "monitoring.coreos.com/v1" or kind not in _MONITORING:
        return [f"{where}: no such kind {obj['apiVersion']} {kind}"]
    errors = _schema_errors(obj, _MONITORING[kind], where)
    for required in _REQUIRED[kind]:
        value: Any = obj
        for part in required.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if not value:
            errors.append(f"{where}: {required} is required")
    return errors


def check_object(obj: dict[str, Any]) -> list[str]:
    """What is wrong with ``obj`` as a Kubernetes object; empty when nothing is."""
    where = f"{obj['kind']}/{obj.get('metadata', {}).get('name')}"
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        return _check_monitoring(obj, where)
    name = model_class(obj["apiVersion"], obj["kind"])
    errors = unknown_fields(obj, name, where)
    if not errors:
        try:
            # Builds the model as the client would from an API answer, which raises on
            # missing required fields.
            k8s.ApiClient()._ApiClient__deserialize(obj, name)  # type: ignore[attr-defined]
        except ValueError as exc:
            errors.append(f"{where}: {exc}")
    return errors
