"""The Pulumi program of every stack: parse the stack config, then compose the stack's components."""

from __future__ import annotations

import dataclasses

import pulumi
from pulumi.runtime import config as runtime_config

from pipeline.validation import ConfigError
from stacks.compose import define_stack
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.installs import missing_artifacts
from stacks.settings import PROJECT

# Config namespaces the program reads: its own, and the Google provider's project and region.
NAMESPACES = (PROJECT, "gcp")


def engine_config_keys() -> set[str]:
    """The name of every config key the engine handed this program.

    `pulumi.Config` reads a key by name but cannot list the keys, and a misspelt key must be an error
    rather than a default silently taken. So the names (only the names: every value is read through
    `pulumi.Config`) come from where `pulumi.Config` itself looks keys up: the PULUMI_CONFIG map the
    language host passes to a program it starts, and the map `pulumi.runtime.set_all_config` fills
    for a program run in-process (Automation API inline programs, the tests' mocks). Reading
    Pulumi.<stack>.yaml instead would miss values that ESC environments or the Automation API supply.
    """
    return {*runtime_config.get_config_env(), *runtime_config.CONFIG.get()}


def is_secret(key: str) -> bool:
    """Whether `key` was set with `pulumi config set --secret` (as the engine lists it)."""
    return key in runtime_config.get_config_secret_keys_env() or pulumi.runtime.is_config_secret(key)


@dataclasses.dataclass(frozen=True)
class StackValues:
    values: dict[str, str]  # "namespace:key" -> the text Pulumi holds (structured values as JSON)
    secret_keys: frozenset[str]


def read_stack_values() -> StackValues:
    """The program's config values through `pulumi.Config`, and which of them are secrets.

    A secret's text is read too: the config decides what the program declares (how many workers,
    which cluster), which needs the value itself. It never leaves the program as plain text in an
    output: with any secret set, `main` marks every stack output secret.
    """
    values, secrets = {}, set()
    for key in sorted(engine_config_keys()):
        namespace, _, name = key.partition(":")
        if namespace not in NAMESPACES:
            continue
        values[key] = pulumi.Config(namespace).get(name)
        if is_secret(key):
            secrets.add(key)
    return StackValues(values, frozenset(secrets))


def exported(outputs: dict[str, pulumi.Input], secret_keys: frozenset[str]) -> dict[str, pulumi.Input]:
    """The stack outputs, every one secret when any config value is: the outputs are built from the
    config (namespace, model name, bucket, ...), and which output holds which value is not tracked."""
    if not secret_keys:
        return outputs
    pulumi.log.warn(f"{', '.join(sorted(secret_keys))}: set as secret, so every stack output is secret; "
                    "the resources this config shapes take its values as given")
    return {name: pulumi.Output.secret(value) for name, value in outputs.items()}


def main() -> None:
    try:
        stack_values = read_stack_values()
        config = parse_stack_config(from_pulumi_values(stack_values.values))
    except ConfigError as error:
        raise pulumi.RunError(f"stack config: {error}") from None  # one line, no traceback
    missing = missing_artifacts(config)
    if missing:
        directory = config.platform.artifact_directory
        raise pulumi.RunError(f"stack config: platform.artifactDirectory: {directory} lacks "
                              f"{', '.join(missing)} (docs/guides/air-gapped.md says what goes there)")
    for name, value in exported(define_stack(config), stack_values.secret_keys).items():
        pulumi.export(name, value)
