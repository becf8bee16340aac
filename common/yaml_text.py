"""YAML as people read it: keys in the order written, shared sub-objects written out in full."""

from __future__ import annotations

import yaml


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no YAML anchors in what people read."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def to_yaml(manifest: dict) -> str:
    return yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False)
