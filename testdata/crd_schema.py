"""Offline validation of a custom resource against its CRD's openAPIV3Schema, as the API server would.

`validate_manifest(crd_file, manifest, strict=True)` returns the errors as `path: message` strings
([] when valid). The CRD's structural schema is checked with jsonschema's Draft 4 validator (the
closest draft to OpenAPI 3.0) after two translations: `nullable: true` also allows null, and, when
strict, an object that declares `properties` rejects any other field (kubectl's default strict field
validation) unless it has `x-kubernetes-preserve-unknown-fields`. Like the API server, and outside
the schema, `metadata.name` must be a DNS-1123 subdomain. Not evaluated: CEL
`x-kubernetes-validations`, `format`, defaults.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the largest CRD is 3 MB of YAML
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_NAME_LENGTH = 253
MAX_MESSAGE_LENGTH = 300  # jsonschema quotes whole sub-objects; keep each error one readable line
NAME_CHECK = "[name check, not from the CRD]"
# Each CRD file's definitions as JSON, by the file's SHA-256: each test process reads a dozen CRDs of
# megabytes, which libyaml parses many times slower than json (docs/results/index.md#the-test-suite).
PARSED_DIR = Path(__file__).resolve().parent.parent / ".cache" / "crd-json"


@functools.cache
def _definitions(crd_file: Path) -> tuple[dict, ...]:
    text = crd_file.read_bytes()
    parsed = PARSED_DIR / f"{hashlib.sha256(text).hexdigest()}.json"
    if parsed.is_file():
        return tuple(json.loads(parsed.read_bytes()))
    definitions = [doc for doc in yaml.load_all(text, Loader=_Loader)
                   if doc and doc.get("kind") == "CustomResourceDefinition"]
    _keep_if_json_holds_it(definitions, parsed)
    return tuple(definitions)


def _keep_if_json_holds_it(definitions: list[dict], parsed: Path) -> None:
    """Writes `definitions` to `parsed` (whole: another process may be reading it) unless JSON would
    change them (a YAML date, a key that is not a string)."""
    try:
        as_json = json.dumps(definitions)
    except TypeError:
        return
    if json.loads(as_json) != definitions:
        return
    PARSED_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=PARSED_DIR, suffix=".part", delete=False) as part:
        part.write(as_json)
    os.replace(part.name, parsed)


GO_ANCHORED_FLAGS = "^(?i)"


def _as_api_server_checks(node: Any, strict: bool) -> Any:
    """The OpenAPI structural schema rewritten into plain JSON Schema with the API server's meaning."""
    if isinstance(node, list):
        return [_as_api_server_checks(item, strict) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: _as_api_server_checks(value, strict) for key, value in node.items()}
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern.startswith(GO_ANCHORED_FLAGS):
        # Go's regexp takes flags after the anchor (Kueue's `^(?i)[a-z]...`); Python's only first.
        schema["pattern"] = "(?i)^" + pattern.removeprefix(GO_ANCHORED_FLAGS)
    if schema.get("nullable") is True and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    if (strict and schema.get("type") == "object" and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        schema["additionalProperties"] = False
    return schema


def _version_schema(crd: dict, version: str) -> dict:
    names = [v["name"] for v in crd["spec"]["versions"]]
    if version not in names:
        raise KeyError(f"version {version!r} is not in CRD {crd['metadata']['name']} "
                       f"(has: {', '.join(names)})")
    found = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = (found.get("schema") or {}).get("openAPIV3Schema")
    if not schema:
        raise ValueError(f"CRD {crd['metadata']['name']} version {version} has no openAPIV3Schema "
                         "(a 'minimal' CRD: use the full one)")
    return schema


@functools.cache
def _validator(crd_file: Path, index: int, version: str, strict: bool) -> jsonschema.Draft4Validator:
    schema = _version_schema(_definitions(crd_file)[index], version)
    return jsonschema.Draft4Validator(_as_api_server_checks(schema, strict))


def _definition_of(crd_file: Path, manifest: dict) -> tuple[int, str]:
    """The index of the CRD in the file that defines the manifest's group and kind, and its version."""
    group, _, version = str(manifest.get("apiVersion") or "").rpartition("/")
    for index, crd in enumerate(_definitions(crd_file)):
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == manifest.get("kind"):
            return index, version
    raise LookupError(f"{manifest.get('apiVersion')} {manifest.get('kind')} is not defined in {crd_file}")


def _name_errors(manifest: dict) -> list[str]:
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name")
    if name is None:
        return [] if metadata.get("generateName") else [f"metadata.name: required {NAME_CHECK}"]
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not DNS1123_SUBDOMAIN.match(name):
        return [f"metadata.name: {name!r} is not a valid DNS-1123 subdomain {NAME_CHECK}"]
    return []


def validate_manifest(crd_file: str | Path, manifest: dict, version: str | None = None,
                      strict: bool = False) -> list[str]:
    """Errors of one manifest against the CRD file that defines its kind; [] means valid.
    Raises LookupError when the file does not define the manifest's group and kind."""
    crd_path = Path(crd_file).resolve()
    index, manifest_version = _definition_of(crd_path, manifest)
    try:
        validator = _validator(crd_path, index, version or manifest_version, strict)
    except KeyError as unknown_version:
        return [str(unknown_version.args[0])]
    errors = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: [str(p) for p in e.absolute_path]):
        path = ".".join(str(p) for p in error.absolute_path) or "<root>"
        message = error.message
        if len(message) > MAX_MESSAGE_LENGTH:
            message = message[:MAX_MESSAGE_LENGTH] + "..."
        errors.append(f"{path}: {message}")
    return errors + _name_errors(manifest)
