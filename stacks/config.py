"""The stack config, parsed once into typed objects before any resource is declared.

Keys live under the project's namespace (`dist-ml:cluster`, `dist-ml:pipeline`, ...), plus a cloud
provider's own (the Google provider's `gcp:project` and `gcp:region` on gke). What every stack has is
stacks/settings.py's (the `pipeline` and `serving` sections are the pipeline's own, pipeline/config.py,
so a value means what it means to `python -m pipeline run`); each cluster kind's module under
stacks/kinds/ declares its stack model with its `cluster` and `storage` sections (K3dStack, GkeStack).
`cluster.kind` picks the model among the kinds registered in stacks/kinds/__init__.py: a key of another
kind, or a bad value, is a ConfigError naming it.

    python -m stacks.config --schema    # the JSON Schema of Pulumi.<stack>.yaml, for editors
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Annotated, Any, Mapping, Sequence, Union

from pydantic import BaseModel, Discriminator, Tag, TypeAdapter, ValidationError

from pipeline.config import PipelineConfig, ServingConfig, without_variant_names
from pipeline.validation import (
    SCHEMA_DIALECT,
    ConfigError,
    config_error,
    key_path,
    schema_command,
    section_at,
    standard_keywords,
)
from stacks.kinds import KINDS
from stacks.settings import PROJECT, StackConfig, StackSettings


def stack_models() -> dict[str, type[StackSettings]]:
    """cluster.kind -> the kind's stack model, from the registry of cluster kinds (stacks/kinds/), read
    when asked: a test may register another kind."""
    return {name: kind.settings for name, kind in KINDS.items()}


def _cluster_kind(raw: Any) -> str | None:
    cluster = raw.get("cluster") if isinstance(raw, Mapping) else getattr(raw, "cluster", None)
    kind = cluster.get("kind") if isinstance(cluster, Mapping) else getattr(cluster, "kind", None)
    return kind if isinstance(kind, str) else None


@functools.cache
def _stack_settings(kinds: tuple[tuple[str, type[StackSettings]], ...]) -> TypeAdapter[StackSettings]:
    return TypeAdapter(Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in kinds)],
                                 Discriminator(_cluster_kind)])


def stack_settings() -> TypeAdapter[StackSettings]:
    """The validator of a stack's settings: the model of the kind `cluster.kind` names."""
    return _stack_settings(tuple(stack_models().items()))


def _stack_config(settings: StackSettings) -> StackConfig:
    cluster, storage, cloud = settings.kind_sections()
    serving = ServingConfig.model_construct(**{name: getattr(settings.serving, name)
                                               for name in ServingConfig.model_fields})
    return StackConfig(namespace=settings.namespace, cluster=cluster, platform=settings.platform,
                       storage=storage, monitoring=settings.monitoring,
                       pipeline=PipelineConfig.of(settings.pipeline, serving),
                       run_on_up=settings.pipeline.run_on_up, cloud=cloud, images=settings.images)


def _stack_error(error: ValidationError, raw: Mapping[str, Any]) -> ConfigError:
    """A stack error as `key.path: problem`: the kind's tag dropped, a key of another kind said so."""
    first = error.errors(include_url=False)[0]
    if first["type"] == "union_tag_invalid":
        tag = first["ctx"]["tag"]
        return ConfigError(f"cluster.kind: must be one of {', '.join(stack_models())}, got {tag!r}")
    if first["type"] == "union_tag_not_found":
        cluster = raw.get("cluster")
        if cluster is not None and not isinstance(cluster, Mapping):
            return ConfigError(f"cluster: must be a mapping of settings, got {type(cluster).__name__}")
        return ConfigError(f"cluster.kind: is required: one of {', '.join(stack_models())}")
    kind, loc = first["loc"][0], first["loc"][1:]
    if first["type"] == "extra_forbidden":
        others = [other for other, model in stack_models().items() if other != kind and (
            _has_key(section_at(model, loc[:-1]), loc[-1])
            or str(loc[-1]).partition(":")[0] == model.PROVIDER)]
        if others:
            problem = (f"applies only to cluster.kind {', '.join(others)}" if len(loc) == 1
                       else f"does not apply to cluster.kind {kind}")
            return ConfigError(f"{key_path(loc)}: {problem}")
    return config_error(error, stack_models()[kind], skip=1)


def _has_key(model: type[BaseModel] | None, key: Any) -> bool:
    return model is not None and any((field.alias or name) == key
                                     for name, field in model.model_fields.items())


def parse_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Typed config of the project's keys (without the `dist-ml:` prefix) and `gcp:` keys (with it);
    raises ConfigError."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: must be a mapping of settings, got {type(raw).__name__}")
    try:
        settings = stack_settings().validate_python(raw)
    except ValidationError as error:
        raise _stack_error(error, raw) from None
    return _stack_config(settings)


EMPTY_VALUES = ("", "null", "{}", "[]")


def from_pulumi_values(values: Mapping[str, str], project: str = PROJECT) -> dict[str, Any]:
    """The project's keys (prefix dropped) and the `gcp:` keys (kept) from Pulumi's config map,
    where structured values are JSON text. A key set to nothing (`pulumi config set dist-ml:namespace
    ""`, or an empty structure) is an error naming it: unset keys default, set ones must say something."""
    raw = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if namespace not in ("gcp", project):
            continue
        shown = key_path([key if namespace == "gcp" else name])
        if not isinstance(value, str):
            raise ConfigError(f"{shown}: must be text as Pulumi passes config, got {type(value).__name__}")
        if value.strip() in EMPTY_VALUES:
            raise ConfigError(f"{shown}: is set but empty; give it a value or remove it "
                              f"(pulumi config rm {key_path([key])})")
        if namespace == "gcp":
            raw[key] = value
            continue
        try:
            raw[name] = json.loads(value) if value[:1] in ("{", "[") else value
        except json.JSONDecodeError as error:
            raise ConfigError(f"{shown}: not valid structured config ({error})") from None
    return raw


# A value set with `pulumi config set --secret` is stored as {secure: ...} in the stack file.
SECURE_VALUE = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
                "additionalProperties": False}


def stack_file_schema() -> dict:
    """The JSON Schema of a Pulumi.<stack>.yaml: its `config` is one stack model, keys prefixed `dist-ml:`."""
    schema = standard_keywords(without_variant_names(stack_settings().json_schema(by_alias=True)))
    definitions = schema.pop("$defs")
    for model in stack_models().values():
        definition = definitions[model.__name__]
        definition["properties"] = {
            (key if ":" in key else f"{PROJECT}:{key}"): {"anyOf": [value, SECURE_VALUE]}
            for key, value in definition["properties"].items()}
        definition["required"] = [f"{PROJECT}:{key}" for key in definition.get("required", [])]
        if model.PROVIDER:  # the provider's own keys (gcp:zone, ...)
            definition["patternProperties"] = {f"^{model.PROVIDER}:": {}}
    return {"$schema": SCHEMA_DIALECT, "title": "dist-ml Pulumi stack file", "type": "object",
            "properties": {"config": schema}, "$defs": definitions}


def main(argv: Sequence[str] | None = None) -> int:
    return schema_command("stacks.config", stack_file_schema, argv)


if __name__ == "__main__":
    sys.exit(main())
