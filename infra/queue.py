"""The training engine's queue, for the pipeline's jobs (engines.base.TrainingEngine.queue_objects: for
TrainJobs, Kueue's ResourceFlavor for the training pool, a ClusterQueue whose quota is what that pool
holds, and the LocalQueue the TrainJobs name), declared in the engine's order, each after the ones
before it: they are deleted in the reverse order (a flavor in use keeps its finalizer)."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from engines.base import QueuePlacement, TrainingEngine


@dataclasses.dataclass(frozen=True)
class TrainingQueueArgs:
    engine: TrainingEngine
    placement: QueuePlacement  # the training pool, and what it holds for training
    namespace: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # the engine's install (its webhooks check these), the namespace
    # The system's namespace: `pulumi destroy` deletes these with it (deleted_with), see stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


class TrainingQueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:TrainingQueue", name, None, opts)
        declared, manifests = [], args.engine.queue_objects(args.placement, args.namespace)
        for manifest in manifests:
            declared.append(k8s.apiextensions.CustomResource(
                f"{name}-{manifest['kind'].lower()}", api_version=manifest["apiVersion"],
                kind=manifest["kind"], metadata=manifest["metadata"], spec=manifest["spec"],
                opts=pulumi.ResourceOptions(
                    parent=self, provider=args.provider, depends_on=[*args.depends_on, *declared],
                    deleted_with=args.deleted_with if manifest["metadata"].get("namespace") else None)))
        self.register_outputs({manifest["kind"]: manifest["metadata"]["name"] for manifest in manifests})
