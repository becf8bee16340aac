"""The tracking server's database on GKE: Cloud SQL for PostgreSQL with a private address only, in the
stack's network through private services access, and IAM database authentication for the server's
Google service account, which its pods act as through Workload Identity. No password exists anywhere:
the Cloud SQL Auth Proxy beside the server logs in with the pod's Google token (infra/tracking.py).

Cloud SQL gives an IAM database user no privileges, and PostgreSQL 15+ lets only the database's owner
create tables in `public`; MLflow creates and migrates its own. The user is therefore given Cloud
SQL's `cloudsqlsuperuser` role through the Admin API (`databaseRoles`), the owner of databases the API
creates (cloud.google.com/sql/docs/postgres/add-manage-iam-users, "Assign or revoke database roles").
The user and database are abandoned rather than deleted on destroy: PostgreSQL cannot drop a role that
owns tables, and deleting the instance removes both.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

from infra.gcs import STORAGE_ROLE, WORKLOAD_IDENTITY_ROLE, workload_identity_member
from infra.network import SERVICES_PEERING_ADDRESS, SERVICES_PEERING_PREFIX

DATABASE_VERSION = "POSTGRES_16"
# ENTERPRISE: POSTGRES_16's default edition, ENTERPRISE_PLUS, refuses shared-core and custom tiers.
EDITION = "ENTERPRISE"
TIER = "db-custom-1-3840"  # 1 vCPU, 3.75 GB: one MLflow server's runs and registry
DATABASE = "mlflow"
IAM_AUTHENTICATION_FLAG = {"name": "cloudsql.iam_authentication", "value": "on"}
CLIENT_ROLES = ("roles/cloudsql.client", "roles/cloudsql.instanceUser")  # connect; log in as IAM user
OWNER_ROLE = "cloudsqlsuperuser"
SERVICE_ACCOUNT_SUFFIX = ".gserviceaccount.com"
ARTIFACTS_FOLDER = "mlflow/"  # the bucket's managed folder the server writes artifacts under


def database_user(email: str) -> str:
    """PostgreSQL's name of a Google service account: its email without `.gserviceaccount.com`."""
    return email.removesuffix(SERVICE_ACCOUNT_SUFFIX)


@dataclasses.dataclass(frozen=True)
class TrackingDatabaseArgs:
    project: str
    region: str
    name: str  # the instance's; the service account is <namespace>-mlflow
    network: pulumi.Input[str]  # the stack's VPC network's id
    bucket: str  # where the server keeps artifacts, under ARTIFACTS_FOLDER
    namespace: str
    kubernetes_service_account: str  # the server's, bound through Workload Identity
    workload_pool: pulumi.Input[str]
    deletion_protection: bool


class TrackingDatabase(pulumi.ComponentResource):
    connection_name: pulumi.Output[str]
    user: pulumi.Output[str]
    service_account_email: pulumi.Output[str]
    artifacts: str

    def __init__(self, name: str, args: TrackingDatabaseArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:TrackingDatabase", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        peering_range = gcp.compute.GlobalAddress(
            f"{name}-peering-range", project=args.project, name=f"{args.name}-services",
            network=args.network, purpose="VPC_PEERING", address_type="INTERNAL",
            address=SERVICES_PEERING_ADDRESS, prefix_length=SERVICES_PEERING_PREFIX, opts=child)
        # Cloud SQL keeps using the peering for a while after its instance is deleted: without
        # REMOVE_PEERING a destroy could not delete the connection, nor then the network.
        peering = gcp.servicenetworking.Connection(
            f"{name}-peering", network=args.network, service="servicenetworking.googleapis.com",
            reserved_peering_ranges=[peering_range.name], deletion_policy="REMOVE_PEERING", opts=child)
        instance = gcp.sql.DatabaseInstance(
            f"{name}-instance", project=args.project, name=args.name, region=args.region,
            database_version=DATABASE_VERSION, deletion_protection=args.deletion_protection,
            settings={
                "tier": TIER, "edition": EDITION,
                "database_flags": [IAM_AUTHENTICATION_FLAG],
                "connector_enforcement": "REQUIRED",  # the Auth Proxy or nothing
                "ip_configuration": {"ipv4_enabled": False, "private_network": args.network,
                                     "allocated_ip_range": peering_range.name,
                                     "ssl_mode": "ENCRYPTED_ONLY"},
                "backup_configuration": {"enabled": True},
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[peering]))
        gcp.sql.Database(f"{name}-database", project=args.project, instance=instance.name, name=DATABASE,
                         deletion_policy="ABANDON", opts=child)
        account = gcp.serviceaccount.Account(
            f"{name}-service-account", project=args.project, account_id=f"{args.namespace}-mlflow",
            display_name="dist-ml MLflow tracking server", opts=child)
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        self.user = account.email.apply(database_user)
        gcp.sql.User(f"{name}-user", project=args.project, instance=instance.name, name=self.user,
                     type="CLOUD_IAM_SERVICE_ACCOUNT", database_roles=[OWNER_ROLE], deletion_policy="ABANDON",
                     opts=child)
        for role in CLIENT_ROLES:
            gcp.projects.IAMMember(f"{name}-{role.rpartition('.')[2].lower()}", project=args.project,
                                   role=role, member=member, opts=child)
        gcp.serviceaccount.IAMMember(
            f"{name}-workload-identity", service_account_id=account.name, role=WORKLOAD_IDENTITY_ROLE,
            member=pulumi.Output.from_input(args.workload_pool).apply(lambda pool: workload_identity_member(
                pool, args.namespace, args.kubernetes_service_account)),
            opts=child)
        # The server alone writes artifacts, under its folder of the bucket (the pipeline's own
        # account holds the bucket; this one holds its folder only). Kept by `pulumi destroy` with the
        # bucket (infra/gcs.py): GCS refuses to delete a managed folder that holds objects.
        folder = gcp.storage.ManagedFolder(f"{name}-artifacts", bucket=args.bucket, name=ARTIFACTS_FOLDER,
                                           opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True))
        gcp.storage.ManagedFolderIamMember(f"{name}-artifacts-admin", bucket=args.bucket,
                                           managed_folder=folder.name, role=STORAGE_ROLE, member=member,
                                           opts=child)
        self.connection_name = instance.connection_name
        self.service_account_email = account.email
        self.artifacts = f"gs://{args.bucket}/{ARTIFACTS_FOLDER.rstrip('/')}"
        self.register_outputs({"instance": instance.name, "connectionName": instance.connection_name,
                               "serviceAccount": account.email})
