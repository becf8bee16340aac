"""Kueue's objects for the pipeline's TrainJobs: a ResourceFlavor for the training pool, a ClusterQueue
whose quota is what that pool holds, and the LocalQueue the TrainJobs name in the pipeline's namespace.

Every variant's TrainJob is submitted at once; Kueue admits one when the quota holds all of its pods
(every replicated job's pods times their requests) and keeps the others suspended until it does, so
that no job starts with part of its workers and holds nodes while it waits for the rest. At admission
Kueue writes the flavor's node labels and tolerations into the TrainJob's pods (its runtime patch), so
they land on the training pool. The flavor's tolerations replace the runtime's (kueue v0.19.2 patches
them in whole), so they are the pool's own.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from cluster_steps.names import TRAINING_QUEUE
from pipeline.manifests import PART_OF

API_VERSION = "kueue.x-k8s.io/v1beta2"
CLUSTER_QUEUE = "dist-ml-training"
FLAVOR_PREFIX = "dist-ml-"


def resource_flavor(pool: str, node_labels: dict, tolerations: tuple[dict, ...]) -> dict:
    spec: dict = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in tolerations]
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
            "metadata": {"name": f"{FLAVOR_PREFIX}{pool}", "labels": dict(PART_OF)}, "spec": spec}


def cluster_queue(flavor: str, quota: dict[str, str], namespace: str) -> dict:
    """Admits the pipeline namespace's jobs (a ClusterQueue without a namespaceSelector admits none)
    within `quota` ({resource: quantity}: Kueue refuses a job that asks for a resource it does not
    cover). BestEffortFIFO: a job that does not fit does not hold back a smaller one behind it."""
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE, "labels": dict(PART_OF)},
            "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                     "queueingStrategy": "BestEffortFIFO",
                     "resourceGroups": [{"coveredResources": list(quota), "flavors": [{
                         "name": flavor,
                         "resources": [{"name": resource, "nominalQuota": amount}
                                       for resource, amount in quota.items()],
                     }]}]}}


def local_queue(namespace: str) -> dict:
    """The queue the TrainJobs name (kueue.x-k8s.io/queue-name). Not `default`: Kueue would then put every
    job of the namespace in it, labelled or not."""
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": TRAINING_QUEUE, "namespace": namespace, "labels": dict(PART_OF)},
            "spec": {"clusterQueue": CLUSTER_QUEUE}}


@dataclasses.dataclass(frozen=True)
class TrainingQueueArgs:
    pool: str  # the training pool's name: the flavor's
    node_labels: dict
    tolerations: tuple[dict, ...]
    quota: dict[str, str]  # resource -> quantity the pool holds for training
    namespace: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # Kueue (its webhooks check these objects), the namespace


class TrainingQueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:TrainingQueue", name, None, opts)
        flavor = resource_flavor(args.pool, args.node_labels, args.tolerations)
        declared = []
        for manifest in (flavor, cluster_queue(flavor["metadata"]["name"], args.quota, args.namespace),
                         local_queue(args.namespace)):
            declared.append(k8s.apiextensions.CustomResource(
                f"{name}-{manifest['kind'].lower()}", api_version=manifest["apiVersion"],
                kind=manifest["kind"], metadata=manifest["metadata"], spec=manifest["spec"],
                # The queue after its flavor, the local queue after its cluster queue: Kueue deletes them
                # in the reverse order (a flavor in use keeps its finalizer).
                opts=pulumi.ResourceOptions(parent=self, provider=args.provider,
                                            depends_on=[*args.depends_on, *declared])))
        self.register_outputs({"localQueue": TRAINING_QUEUE, "clusterQueue": CLUSTER_QUEUE})
