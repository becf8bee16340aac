"""The Pulumi program of every stack: parse the stack config, then compose the stack's components."""

from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from pipeline.config import ConfigError
from stacks.compose import define_stack
from stacks.config import from_pulumi_values, parse_stack_config


def stack_config_values() -> dict[str, str]:
    """Every config value of the stack, as the Pulumi engine hands them to the program."""
    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def main() -> None:
    try:
        config = parse_stack_config(from_pulumi_values(stack_config_values()))
    except ConfigError as error:
        raise pulumi.RunError(f"stack config: {error}") from None  # one line, no traceback
    for name, value in define_stack(config).items():
        pulumi.export(name, value)
