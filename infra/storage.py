"""Storage on the cluster: one PersistentVolumeClaim for data, checkpoints, exports and models."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_target import PART_OF, STORAGE_CLAIM_NAME, ClusterStorage, pvc_storage
from infra.awaits import SKIP_AWAIT


@dataclasses.dataclass(frozen=True)
class PvcStorageArgs:
    namespace: str
    size: str
    access_mode: str
    storage_class: str | None  # None: the cluster's default
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # its namespace
    # The system's namespace: `pulumi destroy` deletes the claim with it (deleted_with), see
    # stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


class PvcStorage(pulumi.ComponentResource):
    storage: ClusterStorage

    def __init__(self, name: str, args: PvcStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:PvcStorage", name, None, opts)
        self.claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-claim",
            metadata={"name": STORAGE_CLAIM_NAME, "namespace": args.namespace, "labels": PART_OF,
                      "annotations": SKIP_AWAIT},
            spec={"accessModes": [args.access_mode],
                  **({"storageClassName": args.storage_class} if args.storage_class else {}),
                  "resources": {"requests": {"storage": args.size}}},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on,
                                        deleted_with=args.deleted_with),
        )
        self.storage = pvc_storage(STORAGE_CLAIM_NAME)
        self.register_outputs({"claim": self.claim.metadata["name"], "uri": self.storage.uri})
