"""The cluster kinds a stack can run on: `cluster.kind` in the stack config names one of them.

Adding a kind: a module beside these with a ClusterKind subclass (base.py says what it declares),
its cluster config in stacks/config.py, and one line here.
"""

from __future__ import annotations

from stacks.kinds.base import ClusterKind
from stacks.kinds.gke import GkeKind
from stacks.kinds.k3d import K3dKind

KINDS: dict[str, type[ClusterKind]] = {
    "k3d": K3dKind,
    "gke": GkeKind,
}
