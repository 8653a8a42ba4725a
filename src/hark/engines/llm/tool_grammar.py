"""JSON schema → llama.cpp GBNF grammar, so that constrained decoding yields valid tool arguments.

The grammar admits one canonical spelling of each JSON value (``", "`` and ``": "`` as
separators, no other whitespace, object properties in schema order), which keeps a small
model's choices to the content. Supported: ``type`` (one or a list), ``properties`` /
``required`` (no other properties are produced), ``enum``, ``const``, ``anyOf`` / ``oneOf``,
``items`` / ``prefixItems`` with ``minItems`` / ``maxItems``, string ``minLength`` /
``maxLength``, local ``$ref`` into ``$defs`` / ``definitions``. Keywords that a grammar cannot
express cheaply (``pattern``, ``format``, numeric bounds, ``allOf``, ``not``) are not enforced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_HEX = "[0-9a-fA-F]"
_BASE_RULES = {
    "char": rf'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" {_HEX}{{4}})',
    "string": r'"\"" char* "\""',
    "integer": '"-"? ("0" | [1-9] [0-9]{0,15})',
    "number": 'integer ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,15})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" (string ": " value (", " string ": " value)*)? "}"',
    "array": '"[" (value (", " value)*)? "]"',
}
# Which base rules each base rule needs, so that a grammar carries only what it uses.
_BASE_DEPS = {
    "string": ("char",),
    "number": ("integer",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("string", "value"),
    "array": ("value",),
}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _json_literal(value: Any) -> str:
    return gbnf_literal(json.dumps(value, ensure_ascii=False))


class _Converter:
    """Collects the rules of one grammar; ``convert`` may be called for several schemas."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}
        self._root_schema: Mapping[str, Any] = {}
        self._refs: dict[str, str] = {}

    def convert(self, schema: Mapping[str, Any]) -> str:
        """An expression for ``schema``, whose local ``$ref`` resolve against itself."""
        self._root_schema = schema
        self._refs = {}
        return self.visit(schema)

    def grammar(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self._rules.items()]
        return "\n".join(lines) + "\n"

    def _base(self, name: str) -> str:
        if name not in self._rules:
            self._rules[name] = _BASE_RULES[name]
            for dep in _BASE_DEPS.get(name, ()):
                self._base(dep)
        return name

    def _new_rule(self, body: str) -> str:
        name = f"r{len(self._rules)}"
        self._rules[name] = body
        return name

    def visit(self, schema: Any) -> str:
        """A GBNF expression (a rule name or a group) matching values of ``schema``."""
        if schema is True or not isinstance(schema, Mapping) or not schema:
            return self._base("value")
        if "$ref" in schema:
            return self._ref(str(schema["$ref"]))
        if "const" in schema:
            return _json_literal(schema["const"])
        if "enum" in schema:
            values = list(schema["enum"])
            return self._alternatives([_json_literal(v) for v in values]) if values else '""'
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._alternatives([self.visit(s) for s in schema[key]])
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._alternatives([self.visit({**schema, "type": k}) for k in kind])
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema)
        if kind == "array":
            return self._array(schema)
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number", "boolean", "null"):
            return self._base(str(kind))
        return self._base("value")

    def _alternatives(self, exprs: Sequence[str]) -> str:
        unique = list(dict.fromkeys(exprs))
        if len(unique) == 1:
            return unique[0]
        return "(" + " | ".join(unique) + ")"

    def _ref(self, ref: str) -> str:
        if ref not in self._refs:
            if not ref.startswith("#"):
                raise ValueError(f"only local $ref is supported, not {ref!r}")
            # Reserve the name first: the definition may refer to itself.
            name = self._new_rule('""')
            self._refs[ref] = name
            self._rules[name] = self.visit(self._resolve(ref))
        return self._refs[ref]

    def _resolve(self, ref: str) -> Any:
        node: Any = self._root_schema
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise ValueError(f"unresolvable $ref {ref!r}")
        return node

    def _string(self, schema: Mapping[str, Any]) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if low == 0 and high is None:
            return self._base("string")
        self._base("char")
        count = f"{{{low},}}" if high is None else f"{{{low},{int(high)}}}"
        return self._new_rule(rf'"\"" char{count} "\""')

    def _array(self, schema: Mapping[str, Any]) -> str:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            items = ' ", " '.join(self.visit(s) for s in prefix)
            return self._new_rule(f'"[" {items} "]"')
        item = self.visit(schema.get("items", True))
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        if high is not None and int(high) == 0:
            return '"[]"'
        tail_low = max(low - 1, 0)
        tail = "*" if high is None else f"{{{tail_low},{int(high) - 1}}}"
        if high is None and tail_low:
            tail = f"{{{tail_low},}}"
        body = f'{item} (", " {item}){tail}'
        if low == 0:
            body = f"({body})?"
        return self._new_rule(f'"[" {body} "]"')

    def _object(self, schema: Mapping[str, Any]) -> str:
        if "properties" not in schema:
            extra = schema.get("additionalProperties", True)
            if extra is False:
                return '"{}"'
            value = self.visit(extra)
            key = self._base("string")
            return self._new_rule(f'"{{" ({key} ": " {value} (", " {key} ": " {value})*)? "}}"')
        properties: Mapping[str, Any] = schema["properties"] or {}
        if not properties:
            return '"{}"'
        required = set(schema.get("required", ()))
        pairs = [
            (
                self._new_rule(f"{_json_literal(name)} {gbnf_literal(': ')} {self.visit(sub)}"),
                name in required,
            )
            for name, sub in properties.items()
        ]
        # after[i]: the properties from i on when one has already been written (comma first);
        # first[i]: the same when none has been written yet.
        after = ['""'] * (len(pairs) + 1)
        first = ['""'] * (len(pairs) + 1)
        for i in range(len(pairs) - 1, -1, -1):
            pair, needed = pairs[i]
            if i == len(pairs) - 1:
                after[i] = f'", " {pair}' if needed else f'(", " {pair})?'
                first[i] = pair if needed else f"({pair})?"
                continue
            if needed:
                after[i] = self._new_rule(f'", " {pair} {after[i + 1]}')
                first[i] = self._new_rule(f"{pair} {after[i + 1]}")
            else:
                after[i] = self._new_rule(f'(", " {pair})? {after[i + 1]}')
                first[i] = self._new_rule(f"{pair} {after[i + 1]} | {first[i + 1]}")
        return self._new_rule(f'"{{" {first[0]} "}}"')


def schema_to_gbnf(schema: Mapping[str, Any]) -> str:
    """A grammar whose ``root`` matches the JSON values valid for ``schema`` (see module doc)."""
    converter = _Converter()
    return converter.grammar(converter.convert(schema))


def arguments_gbnf(parameters: Mapping[str, Any]) -> str:
    """The grammar of a tool's arguments: ``parameters`` as a JSON object, after one space.

    The leading space is there because the prompt ends with ``"arguments":`` and BPE
    vocabularies spell a space and an opening brace as one token.
    """
    converter = _Converter()
    return converter.grammar('" " ' + converter.convert(_as_object(parameters)))


def tool_call_gbnf(tools: Mapping[str, Mapping[str, Any]]) -> str:
    """The grammar of `` "<name>", "arguments": <args>`` for any of ``tools`` (name → schema).

    It continues a prompt that ends with ``{"name":``.
    """
    converter = _Converter()
    choices = []
    for name, parameters in tools.items():
        header = gbnf_literal(" " + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
        choices.append(f"{header} {converter.convert(_as_object(parameters))}")
    return converter.grammar(" | ".join(choices))


def _as_object(parameters: Mapping[str, Any]) -> Mapping[str, Any]:
    """Tool arguments are always an object, whatever the schema leaves unsaid."""
    return parameters if "$ref" in parameters else {**parameters, "type": "object"}
