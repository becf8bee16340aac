"""The tier's nodes, simulated by KWOK: Node objects with the labels, taints and capacity of the stack's
cluster, kept Ready by KWOK's node stages (heartbeats through leases), and pods on them driven by its
pod stages: scheduled pods start and become Ready at once (KWOK's pod-ready); a pod annotated with
EXIT_CODE_ANNOTATION ends with that exit status in every container, as a process would (the tier's
own stage); one annotated with CRASH_LOOP_ANNOTATION has containers the kubelet keeps restarting
(CrashLoopBackOff); a deleted pod goes (KWOK's pod-delete).

The local stack's cluster is one k3d server node (k3s labels it; it has no taints) in the Docker VM
the local defaults are sized for (stacks/kinds/k3d.py DOCKER_VM). The gke stack's are its node pools'
nodes at their largest (each pool's maxNodes), shaped from the pools the stack declares: their labels
and taints, GKE's own labels, a node's allocatable for its machine type, and the GPUs GKE's device
plugin advertises.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from common.cluster_target import GPU_RESOURCE  # what GKE's NVIDIA device plugin advertises
from infra.gke import KUBERNETES_TAINT_EFFECTS, allocatable, machine_size
from stacks import policies, render
from stacks.kinds.k3d import DOCKER_VM
from tools.control_plane.nodes.k3s import (
    INSTANCE_TYPE_LABEL,
    K3S_NODE_LABELS,
    K3S_SERVER_ROLES,
    k3d_server_name,
)

KWOK_NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}  # the nodes KWOK manages (KWOK_NODE_SELECTOR)
KWOK_NODE_SELECTOR = ",".join(f"{key}={value}" for key, value in KWOK_NODE_ANNOTATION.items())
EXIT_CODE_ANNOTATION = "dist-ml.tier/exit-code"
CRASH_LOOP_ANNOTATION = "dist-ml.tier/crash-loop"
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
PODS_PER_NODE = "110"  # the kubelet's default maxPods
POD_CIDR = "10.244.1.0/24"  # KWOK's pod addresses, on the tier's bridge network
NODE_IP = "10.244.0.2"

POD_EXIT_STAGE = f"""
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: dist-ml-tier-pod-exit
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["{EXIT_CODE_ANNOTATION}"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $code := index .metadata.annotations "{EXIT_CODE_ANNOTATION}" }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
        reason: PodCompleted
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
        reason: PodCompleted
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            finishedAt: {{{{ $now | Quote }}}}
            reason: {{{{ if eq $code "0" }}}}Completed{{{{ else }}}}Error{{{{ end }}}}
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {{{{ if eq $code "0" }}}}Succeeded{{{{ else }}}}Failed{{{{ end }}}}
"""


POD_CRASH_LOOP_STAGE = f"""
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: dist-ml-tier-pod-crash-loop
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
    - key: '.metadata.annotations["{CRASH_LOOP_ANNOTATION}"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
        reason: ContainersNotReady
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
        reason: ContainersNotReady
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 3
        started: false
        state:
          waiting:
            reason: CrashLoopBackOff
            message: back-off 40s restarting failed container={{{{ .name }}}}
        lastState:
          terminated:
            exitCode: 1
            reason: Error
            message: the tier's simulated crash
            finishedAt: {{{{ $now | Quote }}}}
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
"""


def stages(kwok_module: Path) -> list[dict]:
    root = kwok_module / "kustomize" / "stage"
    return [
        *(yaml.safe_load((root / path).read_text()) for path in KWOK_STAGES),
        yaml.safe_load(POD_EXIT_STAGE),
        yaml.safe_load(POD_CRASH_LOOP_STAGE),
    ]


def simulated_node(name: str, labels: dict[str, str], taints: list[dict], capacity: dict[str, str]) -> dict:
    resources = {**capacity, "pods": PODS_PER_NODE}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": dict(KWOK_NODE_ANNOTATION),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def k3d_nodes(cluster_name: str) -> list[dict]:
    """The k3d cluster's one server node, as k3s registers it."""
    labels = {**K3S_SERVER_ROLES, **K3S_NODE_LABELS}
    return [simulated_node(k3d_server_name(cluster_name), labels, [], dict(DOCKER_VM))]


# The labels GKE gives every node of a pool, a Spot VM's and a GPU node's
# (https://cloud.google.com/kubernetes-engine/docs/how-to/node-pools, .../concepts/spot-vms,
# .../how-to/gpus).
GKE_POOL_LABEL = "cloud.google.com/gke-nodepool"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"


def gke_nodes(rendered: render.Rendered) -> list[dict]:
    """Every node the gke stack's pools can have (each pool's maxNodes), as GKE registers them."""
    return [node_of_pool(pool.name, pool.inputs, index)
            for pool in rendered.of_type(policies.GKE_NODE_POOL)
            for index in range(pool.inputs["autoscaling"]["totalMaxNodeCount"])]


def node_of_pool(pool_name: str, pool: dict, index: int) -> dict:
    config = pool["nodeConfig"]
    size = machine_size(config["machineType"])
    if size is None:
        raise ValueError(f"node pool {pool_name}: machine type {config['machineType']} has no known size")
    cpus, memory_gib = allocatable(*size)
    capacity = {"cpu": f"{int(cpus * 1000)}m", "memory": f"{int(memory_gib * 1024)}Mi"}
    labels = {GKE_POOL_LABEL: pool_name, INSTANCE_TYPE_LABEL: config["machineType"], **config["labels"]}
    if config.get("spot"):
        labels[GKE_SPOT_LABEL] = "true"
    for accelerator in config.get("guestAccelerators", []):
        labels[GKE_ACCELERATOR_LABEL] = accelerator["type"]
        capacity[GPU_RESOURCE] = str(accelerator["count"])
    taints = [{"key": t["key"], "value": t["value"], "effect": KUBERNETES_TAINT_EFFECTS[t["effect"]]}
              for t in config.get("taints", [])]
    return simulated_node(f"gke-{pool['cluster']}-{pool_name}-{index}", labels, taints, capacity)


def k3s_local_path(claims: list[dict], node_name: str, directory: Path) -> list[dict]:
    """k3s's local-path StorageClass, and the volume its provisioner would make for each of `claims` on
    the node (a host directory under `directory`, the node's only), made here ahead of the claim, bound
    to it by name."""
    classes = {claim["spec"]["storageClassName"] for claim in claims}
    if len(classes) != 1:
        raise ValueError(f"the k3d stack's claims name one storage class, k3s's, not {sorted(classes)}")
    volumes = [local_path_volume(claim, node_name, directory / claim["metadata"]["name"]) for claim in claims]
    return [local_path_class(classes.pop()), *volumes]


def local_path_class(name: str) -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "rancher.io/local-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def local_path_volume(claim: dict, node_name: str, directory: Path) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{claim['metadata']['name']}"},
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": list(claim["spec"]["accessModes"]),
            "storageClassName": claim["spec"]["storageClassName"],
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"]},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                }
            },
        },
    }
