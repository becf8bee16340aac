"""The cluster kinds a stack can run on: `cluster.kind` in the stack config names one of them.

Adding a kind is one module beside these and one line in KINDS: the module holds the kind's stack
config (a subclass of stacks/settings.py's StackSettings with its `cluster` section, whose `kind` is
the kind's name, and its `storage` section) and a ClusterKind subclass that declares the cluster,
images and storage (base.py says what each returns). KINDS is the one registry: stacks/config.py
parses a stack's config with the models it names, stacks/compose.py declares the stack with its
kinds. tests/test_cluster_kinds.py plugs in a fake kind that way.
"""

from __future__ import annotations

from stacks.kinds.base import ClusterKind
from stacks.kinds.existing import ExistingKind
from stacks.kinds.gke import GkeKind
from stacks.kinds.k3d import K3dKind

KINDS: dict[str, type[ClusterKind]] = {
    "k3d": K3dKind,
    "gke": GkeKind,
    "existing": ExistingKind,
}
