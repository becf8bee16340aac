"""What k3d and k3s give a node, whichever kind of node plays it (kwok.py's simulated server, real.py's
agent): its name and its labels."""

from __future__ import annotations

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The labels k3s gives its nodes (a server's roles too).
K3S_NODE_LABELS = {INSTANCE_TYPE_LABEL: "k3s"}
K3S_SERVER_ROLES = {"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/master": "true"}


def k3d_server_name(cluster_name: str) -> str:
    """k3d's name for its cluster's first server node."""
    return f"k3d-{cluster_name}-server-0"


def k3d_agent_name(cluster_name: str) -> str:
    """k3d's name for its cluster's first agent node."""
    return f"k3d-{cluster_name}-agent-0"
