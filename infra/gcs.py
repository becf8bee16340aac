"""Storage on GKE: a private GCS bucket, and a Google service account that may use it, bound through
Workload Identity to the Kubernetes service accounts that need it. No key is ever created.

The bucket's data outlives the stack: `pulumi destroy` leaves the bucket and what it holds (datasets,
models, MLflow's artifacts) and forgets it (retain_on_delete); GCS refuses to delete a bucket that holds
objects, which would stop the destroy there (docs/guides/deploy-gke.md#teardown)."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

from common.cluster_target import ClusterStorage, gcs_storage

STORAGE_ROLE = "roles/storage.objectAdmin"
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
CHECKPOINTS_PREFIX = "checkpoints/"


def workload_identity_member(workload_pool: str, namespace: str, service_account: str) -> str:
    """The IAM principal of a Kubernetes service account in the cluster's identity pool."""
    return f"serviceAccount:{workload_pool}[{namespace}/{service_account}]"


@dataclasses.dataclass(frozen=True)
class GcsStorageArgs:
    project: str
    location: str
    bucket_name: str
    checkpoint_retention_days: int
    namespace: str
    kubernetes_service_accounts: tuple[str, ...]  # who may use the bucket
    # The cluster's Workload Identity pool (PROJECT.svc.id.goog), as the cluster reports it: IAM refuses
    # members of a pool that does not exist yet, so the bindings must wait for the cluster.
    workload_pool: pulumi.Input[str]


class GcsStorage(pulumi.ComponentResource):
    storage: ClusterStorage
    service_account_email: pulumi.Output[str]

    def __init__(self, name: str, args: GcsStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:GcsStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bucket = gcp.storage.Bucket(
            f"{name}-bucket",
            name=args.bucket_name,
            project=args.project,
            location=args.location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning={"enabled": True},
            lifecycle_rules=[
                # Backups of finished training are useless after a while; exports and models stay.
                {"action": {"type": "Delete"},
                 "condition": {"age": args.checkpoint_retention_days,
                               "matches_prefixes": [CHECKPOINTS_PREFIX]}},
                # Versioning keeps overwritten objects; old ones go after the same time.
                {"action": {"type": "Delete"},
                 "condition": {"days_since_noncurrent_time": args.checkpoint_retention_days}},
            ],
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        account = gcp.serviceaccount.Account(
            f"{name}-service-account", project=args.project, account_id=f"{args.namespace}-storage",
            display_name="dist-ml pipeline and predictor storage access", opts=child)
        gcp.storage.BucketIAMMember(
            f"{name}-object-admin", bucket=bucket.name, role=STORAGE_ROLE,
            member=account.email.apply(lambda email: f"serviceAccount:{email}"), opts=child)
        for kubernetes_account in args.kubernetes_service_accounts:
            gcp.serviceaccount.IAMMember(
                f"{name}-workload-identity-{kubernetes_account}",
                service_account_id=account.name, role=WORKLOAD_IDENTITY_ROLE,
                member=pulumi.Output.from_input(args.workload_pool).apply(
                    lambda pool, account=kubernetes_account: workload_identity_member(
                        pool, args.namespace, account)),
                opts=child)
        self.storage = gcs_storage(args.bucket_name)
        self.service_account_email = account.email
        self.register_outputs({"bucket": bucket.url, "serviceAccount": account.email})
