"""The MLflow tracking server the pipeline's pods record into (docs/concepts/tracking.md): one Deployment
of MLflow's server (the stack's tracking-server image), a ClusterIP Service and a NetworkPolicy that
lets only the pipeline's namespace reach it; nothing outside the cluster does (`kubectl port-forward`
for a person, as for the model).

The server proxies artifacts (`--serve-artifacts`), so training pods need no rights on where they
land. An init container migrates its database (`mlflow db upgrade`) before the server starts, so a
new MLflow in the image finds the schema it expects. Its backend, by cluster kind:
- `VolumeBackend` (k3d): SQLite and the artifacts on a volume of its own, one replica, recreated
  rather than rolled (two servers must never write one SQLite file). A PostgreSQL in the cluster would
  be a second stateful service to run for one user's runs; SQLite on a volume keeps them as well.
- `CloudSqlBackend` (GKE): a Cloud SQL for PostgreSQL database with a private address only
  (infra/cloud_sql.py), reached through the Cloud SQL Auth Proxy as a native sidecar with IAM database
  authentication: the server's service account is the database user through Workload Identity, and
  no password exists anywhere. Artifacts in the stack's bucket.
"""

from __future__ import annotations

import dataclasses
import urllib.parse

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_names import CLUSTER_DOMAIN
from common.cluster_target import IMAGE_USER, PART_OF
from common.pod_security import container_security_context, pod_security_context
from common.tracking_names import SERVER_NAME, SERVER_PORT
from infra.accounts import service_account
from infra.awaits import SKIP_AWAIT
from pipeline.config import Resources

SERVER_ACCOUNT = "dist-ml-mlflow"
MIGRATE_CONTAINER = "migrate-database"
SERVER_RESOURCES = Resources(requests={"cpu": "100m", "memory": "512Mi"},
                             limits={"cpu": "1", "memory": "1536Mi"})
# MLflow 3.17.2's server starts a job runner for its GenAI jobs (online scoring, trace archival) by
# default: nine huey consumer processes, 2.4 GiB together beside the 260 MiB server, over the limit
# (the real node's kubelet OOM-killed it in a loop). Tracking and the registry need none of it
# (mlflow/environment_variables.py: MLFLOW_SERVER_ENABLE_JOB_EXECUTION).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
DATA_DIR = "/mlflow"  # the volume backend's mount
VOLUME_SIZE = "2Gi"
# The Cloud SQL Auth Proxy (GoogleCloudPlatform/cloud-sql-proxy v2), on localhost beside the server.
CLOUD_SQL_PROXY_IMAGE = "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.25.3"
CLOUD_SQL_PROXY_PORT = 5432
CLOUD_SQL_PROXY_HEALTH_PORT = 9801
CLOUD_SQL_PROXY_RESOURCES = Resources(requests={"cpu": "50m", "memory": "64Mi"},
                                      limits={"cpu": "500m", "memory": "256Mi"})
# MLflow's server refuses requests whose Host header it does not know (DNS rebinding): the Service's
# names as the pipeline's pods call it, and localhost for a port-forward.
LOCAL_HOSTS = ("localhost:*", "127.0.0.1:*")


@dataclasses.dataclass(frozen=True)
class VolumeBackend:
    """SQLite and artifacts on a PersistentVolumeClaim of the cluster's storage class (None: its default)."""
    storage_class: str | None = None
    size: str = VOLUME_SIZE


@dataclasses.dataclass(frozen=True)
class CloudSqlBackend:
    """A Cloud SQL database through the Auth Proxy with IAM authentication, artifacts under a URI."""
    connection_name: pulumi.Input[str]  # PROJECT:REGION:INSTANCE
    database_user: pulumi.Input[str]  # the server's Google service account as PostgreSQL knows it
    database: str
    artifacts: str  # gs://BUCKET/PREFIX


TrackingBackend = VolumeBackend | CloudSqlBackend


@dataclasses.dataclass(frozen=True)
class TrackingServerArgs:
    image: pulumi.Input[str]
    namespace: str
    backend: TrackingBackend
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]
    # What lets the server's pods act as its Google service account (Workload Identity), on GKE.
    service_account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)
    # The system's namespace: `pulumi destroy` deletes these with it (deleted_with), see stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


def allowed_hosts(namespace: str) -> str:
    names = (SERVER_NAME, f"{SERVER_NAME}.{namespace}", f"{SERVER_NAME}.{namespace}.svc",
             f"{SERVER_NAME}.{namespace}.svc.{CLUSTER_DOMAIN}")
    return ",".join([*(f"{name}:{SERVER_PORT}" for name in names), *LOCAL_HOSTS])


def server_command(namespace: str, backend_uri: str, artifacts: str) -> list[str]:
    """`mlflow server`'s arguments (the image's entrypoint)."""
    return ["--host", "0.0.0.0", "--port", str(SERVER_PORT), "--backend-store-uri", backend_uri,
            "--serve-artifacts", "--artifacts-destination", artifacts,
            "--allowed-hosts", allowed_hosts(namespace), "--workers", "1"]


def postgres_uri(database_user: str, database: str) -> str:
    """The database through the proxy on localhost; IAM authentication needs no password."""
    user = urllib.parse.quote(database_user, safe="")
    return f"postgresql://{user}@127.0.0.1:{CLOUD_SQL_PROXY_PORT}/{database}"


def migrate_container(image: str, backend_uri: str) -> dict:
    """`mlflow db upgrade` of the server's database, before the server starts. `mlflow server` (3.17.2)
    migrates a store missing one of its tables itself, under the pod's startup probe, which can kill it
    part way (MLflow's migrations are not transactional), and refuses a store whose tables are all there
    at an older revision ("out-of-date database schema"). MLflow's command creates an empty database's
    tables and migrates an older one; a current one it leaves as it is."""
    return {
        "name": MIGRATE_CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["mlflow", "db", "upgrade", backend_uri],
        "resources": SERVER_RESOURCES.as_manifest(),
        "securityContext": container_security_context(),
    }


def server_container(image: str, args: list[str]) -> dict:
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "name": "mlflow", "image": image, "imagePullPolicy": "IfNotPresent", "args": args,
        "env": [{"name": name, "value": value} for name, value in SERVER_ENV.items()],
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "resources": SERVER_RESOURCES.as_manifest(),
        # Its import and its workers' start: the database is migrated before the container starts.
        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 60},
        "readinessProbe": {**probe, "periodSeconds": 10},
        "livenessProbe": {**probe, "periodSeconds": 20, "failureThreshold": 3},
        "securityContext": container_security_context(),
    }


def cloud_sql_proxy(connection_name: str) -> dict:
    """The Auth Proxy as a native sidecar (an init container that keeps running): it starts first and
    stops last. Private IP only, IAM authentication as the pod's Google service account."""
    return {
        "name": "cloud-sql-proxy", "image": CLOUD_SQL_PROXY_IMAGE, "restartPolicy": "Always",
        "args": ["--private-ip", "--auto-iam-authn", "--structured-logs", "--exit-zero-on-sigterm",
                 f"--port={CLOUD_SQL_PROXY_PORT}", "--health-check", "--http-address=0.0.0.0",
                 f"--http-port={CLOUD_SQL_PROXY_HEALTH_PORT}", connection_name],
        "ports": [{"name": "proxy-health", "containerPort": CLOUD_SQL_PROXY_HEALTH_PORT, "protocol": "TCP"}],
        "startupProbe": {"httpGet": {"path": "/startup", "port": "proxy-health"},
                         "periodSeconds": 1, "failureThreshold": 60},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "proxy-health"},
                          "periodSeconds": 10, "failureThreshold": 3},
        "resources": CLOUD_SQL_PROXY_RESOURCES.as_manifest(),
        "securityContext": container_security_context(),
    }


def volume_pod(image: str, namespace: str, claim: str) -> dict:
    data = {"name": "data", "mountPath": DATA_DIR}
    backend = f"sqlite:///{DATA_DIR}/mlflow.db"
    container = server_container(image, server_command(namespace, backend, f"{DATA_DIR}/artifacts"))
    return {"initContainers": [{**migrate_container(image, backend), "volumeMounts": [data]}],
            "containers": [{**container, "volumeMounts": [data]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "securityContext": pod_security_context(IMAGE_USER)}  # SQLite and artifacts on the claim


def cloud_sql_pod(image: str, namespace: str, connection_name: str, database_user: str, database: str,
                  artifacts: str) -> dict:
    # The proxy first: a native sidecar has started (its startup probe passed) before the next init
    # container, the migration, runs through it.
    backend = postgres_uri(database_user, database)
    return {"securityContext": pod_security_context(),
            "initContainers": [cloud_sql_proxy(connection_name), migrate_container(image, backend)],
            "containers": [server_container(image, server_command(namespace, backend, artifacts))]}


def deployment_spec(pod: dict, labels: dict, single_writer: bool) -> dict:
    spec = {"replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"serviceAccountName": SERVER_ACCOUNT, **pod}}}
    if single_writer:
        spec["strategy"] = {"type": "Recreate"}
    return spec


def network_policy(namespace: str, labels: dict) -> dict:
    """Only the pipeline's namespace reaches the server (its steps and training pods)."""
    return {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": namespace}}}],
                "ports": [{"port": SERVER_PORT, "protocol": "TCP"}]}]}


class TrackingServer(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrackingServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:TrackingServer", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on,
                                            deleted_with=args.deleted_with)
        labels = {"app.kubernetes.io/name": SERVER_NAME, **PART_OF}
        metadata = {"name": SERVER_NAME, "namespace": args.namespace, "labels": labels}
        account = service_account(f"{name}-service-account", SERVER_ACCOUNT, args.namespace,
                                  args.service_account_annotations, on_cluster)
        needs = [account]
        backend = args.backend
        if isinstance(backend, VolumeBackend):
            # k3s' local-path class binds on first use: the pod, not Pulumi, waits for the claim.
            claim = k8s.core.v1.PersistentVolumeClaim(
                f"{name}-data", metadata={**metadata, "annotations": SKIP_AWAIT},
                spec={"accessModes": ["ReadWriteOnce"], "storageClassName": backend.storage_class,
                      "resources": {"requests": {"storage": backend.size}}},
                opts=on_cluster)
            needs.append(claim)
            pod = pulumi.Output.from_input(args.image).apply(
                lambda image: volume_pod(image, args.namespace, SERVER_NAME))
        else:
            pod = pulumi.Output.all(args.image, backend.connection_name, backend.database_user).apply(
                lambda values: cloud_sql_pod(values[0], args.namespace, values[1], values[2],
                                             backend.database, backend.artifacts))
        deployment = k8s.apps.v1.Deployment(
            f"{name}-server", metadata=metadata,
            spec=pod.apply(lambda spec: deployment_spec(spec, labels, isinstance(backend, VolumeBackend))),
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=needs)))
        k8s.core.v1.Service(
            f"{name}-service", metadata=metadata,
            spec={"type": "ClusterIP", "selector": labels,
                  "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}]},
            opts=on_cluster)
        k8s.networking.v1.NetworkPolicy(f"{name}-network-policy", metadata=metadata,
                                        spec=network_policy(args.namespace, labels), opts=on_cluster)
        self.register_outputs({"deployment": deployment.metadata["name"]})
