"""The project's CRD validator (testdata/crd_schema.py) on a small CRD written here, so that what it
accepts and rejects is checked without the upstream files; the upstream ones are exercised by the
render and stack tests through the `validate_crd` fixture."""

from __future__ import annotations

import copy
import datetime
import json
import shutil
from pathlib import Path

import pytest
import yaml

from testdata import crd_schema
from testdata.crd_schema import validate_manifest

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"kind": "Widget", "plural": "widgets"},
        "scope": "Namespaced",
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["replicas"],
                    "properties": {
                        "replicas": {"type": "integer", "format": "int32"},
                        "note": {"type": "string", "nullable": True},
                        "port": {"anyOf": [{"type": "integer"}, {"type": "string"}],
                                 "x-kubernetes-int-or-string": True},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "properties": {"known": {"type": "string"}},
                                  "x-kubernetes-preserve-unknown-fields": True},
                    },
                },
            },
        }}}, {"name": "v2alpha1", "served": True, "storage": False}],
    },
}
WIDGET = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "my-widget.a1"},
          "spec": {"replicas": 3, "note": None, "port": "http", "labels": {"a": "b"},
                   "extra": {"known": "x", "anything": {"goes": 1}}}}


@pytest.fixture
def crd_file(tmp_path: Path) -> Path:
    path = tmp_path / "example.com_widgets.yaml"
    # A second document of another kind, as upstream CRD files sometimes hold several.
    other = {**copy.deepcopy(CRD), "metadata": {"name": "gadgets.example.com"}}
    other["spec"]["names"] = {"kind": "Gadget", "plural": "gadgets"}
    path.write_text(yaml.safe_dump_all([CRD, other]))
    return path


def widget(**spec_changes) -> dict:
    doc = copy.deepcopy(WIDGET)
    doc["spec"].update(spec_changes)
    return doc


def test_a_valid_manifest_has_no_errors(crd_file):
    assert validate_manifest(crd_file, WIDGET, strict=True) == []


def test_wrong_types_and_missing_required_fields_name_their_path(crd_file):
    doc = widget(replicas="three")
    assert validate_manifest(crd_file, doc) == ["spec.replicas: 'three' is not of type 'integer'"]
    del doc["spec"]["replicas"]
    assert validate_manifest(crd_file, doc) == ["spec: 'replicas' is a required property"]
    assert validate_manifest(crd_file, widget(labels={"a": 1})) == [
        "spec.labels.a: 1 is not of type 'string'"]


def test_an_undeclared_field_fails_only_in_strict_mode(crd_file):
    doc = widget(replica=2)
    assert validate_manifest(crd_file, doc) == []
    (error,) = validate_manifest(crd_file, doc, strict=True)
    assert error.startswith("spec: Additional properties are not allowed ('replica' was unexpected)")


def test_preserve_unknown_fields_and_nullable_are_honoured_in_strict_mode(crd_file):
    assert validate_manifest(crd_file, widget(extra={"whatever": [1, 2]}), strict=True) == []
    assert validate_manifest(crd_file, widget(note=None), strict=True) == []
    assert validate_manifest(crd_file, widget(note=5), strict=True) == [
        "spec.note: 5 is not of type 'string', 'null'"]


@pytest.mark.parametrize("name", ["My-Widget", "widget_1", "-widget", "a" * 254, 7])
def test_the_object_name_must_be_a_dns_1123_subdomain(crd_file, name):
    doc = copy.deepcopy(WIDGET)
    doc["metadata"]["name"] = name
    (error,) = validate_manifest(crd_file, doc)
    assert error.startswith("metadata.name:") and "DNS-1123 subdomain" in error


def test_a_name_or_generate_name_is_required(crd_file):
    doc = copy.deepcopy(WIDGET)
    doc["metadata"] = {"generateName": "widget-"}
    assert validate_manifest(crd_file, doc) == []
    doc["metadata"] = {}
    (error,) = validate_manifest(crd_file, doc)
    assert error.startswith("metadata.name: required")


def test_the_crd_is_chosen_by_group_and_kind_and_the_version_by_api_version(crd_file):
    gadget = {**copy.deepcopy(WIDGET), "kind": "Gadget"}
    assert validate_manifest(crd_file, gadget, strict=True) == []
    with pytest.raises(LookupError, match="example.org/v1 Widget is not defined in"):
        validate_manifest(crd_file, {**WIDGET, "apiVersion": "example.org/v1"})
    (error,) = validate_manifest(crd_file, {**WIDGET, "apiVersion": "example.com/v9"})
    assert error == "version 'v9' is not in CRD widgets.example.com (has: v1, v2alpha1)"
    with pytest.raises(ValueError, match="v2alpha1 has no openAPIV3Schema"):
        validate_manifest(crd_file, {**WIDGET, "apiVersion": "example.com/v2alpha1"})


def test_the_json_kept_for_a_crd_files_content_is_read_instead_of_its_yaml(tmp_path, monkeypatch):
    """Unless JSON cannot hold the definitions as they are: then none is kept."""
    monkeypatch.setattr(crd_schema, "PARSED_DIR", tmp_path / "parsed")
    first = tmp_path / "first" / "widgets.yaml"
    first.parent.mkdir()
    first.write_text(yaml.safe_dump(CRD))
    assert validate_manifest(first, widget()) == []
    (kept,) = (tmp_path / "parsed").iterdir()
    # The same content elsewhere is read from the JSON kept for it: here one saying replicas is a string.
    definitions = json.loads(kept.read_text())
    definitions[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "replicas"]["type"] = "string"
    kept.write_text(json.dumps(definitions))
    same = tmp_path / "same" / "widgets.yaml"
    same.parent.mkdir()
    shutil.copy(first, same)
    assert validate_manifest(same, widget()) == ["spec.replicas: 3 is not of type 'string'"]
    # A YAML date would not come back from JSON as itself: that file is read from its YAML each time.
    dated = copy.deepcopy(CRD)
    dated["metadata"]["annotations"] = {"since": datetime.date(2024, 1, 2)}
    (tmp_path / "dated.yaml").write_text(yaml.safe_dump(dated))
    assert validate_manifest(tmp_path / "dated.yaml", widget()) == []
    assert list((tmp_path / "parsed").iterdir()) == [kept]
