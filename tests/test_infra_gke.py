"""The GKE stack under Pulumi mocks: components, Google Cloud policies, Workload Identity, node pools
and where training runs, the nodes' service account, monitoring, valid objects, the same pipeline and
InferenceService as the local stack, the stack file a first-time user starts from, and the PR check."""

from __future__ import annotations

import json
import re

import pytest
import stack_checks
import yaml
from conftest import REPO_ROOT, run_module
from stack_checks import config_error_before_any_resource, embedded, objects_of, rendered_stack, validate_all

from common import cluster_names
from common.cluster_target import KUBERNETES_MINOR
from common.tracking_names import SERVER_NAME
from infra import network
from infra.gcp_apis import GCP_APIS
from pipeline.definition import train_step_name
from stacks import policies, render
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.declared import Declared
from stacks.installs import platform_ports
from trainer.variants import VARIANTS

STACK_FILE = REPO_ROOT / "Pulumi.gke.yaml"
LOCAL_STACK_FILE = REPO_ROOT / "Pulumi.local.yaml"
PROJECT = "dist-ml-test-4821"  # what a user sets: the stack file has no project
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                   "effect": "NoSchedule"}
TRAINING_TAINT_KEYS = {GPU_TOLERATION["key"], SPOT_TOLERATION["key"]}
TRAIN_STEPS = tuple(train_step_name(variant) for variant in VARIANTS)  # the stack's default: every variant
NODE_POOL = "gcp:container/nodePool:NodePool"
ACCOUNT = "gcp:serviceaccount/account:Account"
SERVICE = "gcp:projects/service:Service"  # enables an API, through Service Usage (on in every project)
# The module of a Google resource type (gcp:<module>/<type>:<Type>) -> the API that creates it.
MODULE_APIS = {
    "artifactregistry": "artifactregistry.googleapis.com",
    "certificatemanager": "certificatemanager.googleapis.com",
    "compute": "compute.googleapis.com",
    "container": "container.googleapis.com",
    "logging": "logging.googleapis.com",
    "monitoring": "monitoring.googleapis.com",
    "projects": "cloudresourcemanager.googleapis.com",
    "serviceaccount": "iam.googleapis.com",
    "servicenetworking": "servicenetworking.googleapis.com",
    "sql": "sqladmin.googleapis.com",
    "storage": "storage.googleapis.com",
}


def stack_file_values() -> dict[str, str]:
    """Pulumi.gke.yaml's values after `pulumi config set gcp:project`."""
    return {**render.pulumi_values(STACK_FILE), "gcp:project": PROJECT}


def gke_values(**sections: dict) -> dict[str, str]:
    return {**stack_checks.stack_values(STACK_FILE, **sections), "gcp:project": PROJECT}


def gke_config_of(values: dict[str, str]):
    return parse_stack_config(from_pulumi_values(values))


@pytest.fixture(scope="module")
def gke_stack() -> render.Rendered:
    return rendered_stack("gke", gke_values())


def training_pod(rendered: render.Rendered, step: str = "train-cnn") -> dict:
    """A node pod of the step's TrainJob, as it would run once Kueue admitted it."""
    return stack_checks.training_pods(rendered, step)[0]


def test_every_component_is_declared(gke_stack):
    types = {resource.type for resource in gke_stack.resources}
    for component in ("GcpApis", "GkeCluster", "RegistryImages", "Platform", "GcsStorage", "Pipeline",
                      "Serving", "Monitoring"):
        assert f"dist-ml:infra:{component}" in types
    (cluster,) = gke_stack.of_type("gcp:container/cluster:Cluster")
    inputs = cluster.inputs
    assert inputs["removeDefaultNodePool"] is True and inputs["deletionProtection"] is True
    assert inputs["workloadIdentityConfig"] == {"workloadPool": f"{PROJECT}.svc.id.goog"}
    assert inputs["releaseChannel"] == {"channel": "REGULAR"} and inputs["location"] == "us-central1"
    # No older control plane than the objects are written for; the channel upgrades it from there.
    assert inputs["minMasterVersion"] == KUBERNETES_MINOR
    assert inputs["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    (repository,) = gke_stack.of_type("gcp:artifactregistry/repository:Repository")
    assert repository.inputs["format"] == "DOCKER"
    assert "kubeconfig" in gke_stack.secret_outputs
    kubeconfig = gke_stack.outputs["kubeconfig"]
    assert "exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n" in kubeconfig
    assert "command: gke-gcloud-auth-plugin" in kubeconfig


def test_the_cluster_upgrades_in_its_window_and_holds_minor_upgrades_until_the_minors_end_of_support(
        gke_stack):
    """GKE's exclusion scopes (kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions):
    NO_MINOR_UPGRADES lets patches in and holds the minor; UNTIL_END_OF_SUPPORT ends it with the minor's
    support. The window: weekends, 6 hours a day (48 hours in any 32 days, as GKE requires)."""
    (cluster,) = gke_stack.of_type(policies.GKE_CLUSTER)
    policy = cluster.inputs["maintenancePolicy"]
    assert policy["recurringWindow"] == {"startTime": "2026-01-03T02:00:00Z",
                                         "endTime": "2026-01-03T08:00:00Z",
                                         "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU"}
    (exclusion,) = policy["maintenanceExclusions"]
    assert exclusion["exclusionOptions"] == {"scope": "NO_MINOR_UPGRADES",
                                             "endTimeBehavior": "UNTIL_END_OF_SUPPORT"}
    assert "endTime" not in exclusion  # GKE takes an end time or an end behavior, not both
    assert cluster.inputs["minMasterVersion"] == KUBERNETES_MINOR
    unheld = rendered_stack("gke", gke_values(cluster={"kind": "gke",
                                                       "maintenance": {"holdMinorUpgrades": False}}))
    (cluster,) = unheld.of_type(policies.GKE_CLUSTER)
    assert "maintenanceExclusions" not in cluster.inputs["maintenancePolicy"]


def test_the_cluster_is_closed_private_nodes_a_dns_endpoint_dataplane_v2_and_shielded_nodes(gke_stack):
    (cluster,) = gke_stack.of_type(policies.GKE_CLUSTER)
    inputs = cluster.inputs
    assert inputs["privateClusterConfig"] == {"enablePrivateNodes": True, "enablePrivateEndpoint": True,
                                              "privateEndpointSubnetwork": "dist-ml-control-plane"}
    assert inputs["controlPlaneEndpointsConfig"] == {"dnsEndpointConfig": {"allowExternalTraffic": True},
                                                     "ipEndpointsConfig": {"enabled": True}}
    assert inputs["datapathProvider"] == "ADVANCED_DATAPATH" and inputs["enableShieldedNodes"] is True
    for pool in gke_stack.of_type(NODE_POOL):
        assert pool.inputs["networkConfig"] == {"enablePrivateNodes": True}, pool.name
        assert pool.inputs["nodeConfig"]["shieldedInstanceConfig"] == {
            "enableSecureBoot": True, "enableIntegrityMonitoring": True}, pool.name
    # The private nodes' way out: Cloud NAT on the nodes' subnet, every range of it; the cluster after it.
    (nat,) = gke_stack.of_type("gcp:compute/routerNat:RouterNat")
    assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
    assert [s["sourceIpRangesToNats"] for s in nat.inputs["subnetworks"]] == [["ALL_IP_RANGES"]]
    assert "network-nat" in cluster.depends_on
    # Pulumi and kubectl reach the control plane through its DNS-based endpoint, as their Google identity.
    kubeconfig = yaml.safe_load(gke_stack.outputs["kubeconfig"])
    (entry,) = kubeconfig["clusters"]
    assert entry["cluster"] == {"server": "https://gke-0a1b2c3d4e5f-4821.us-central1.gke.goog"}
    assert policies.closed_clusters(gke_stack.resources) == []


def test_authorized_networks_open_the_public_ip_endpoint_to_those_ranges_only():
    rendered = rendered_stack("gke", gke_values(cluster={"authorizedNetworks": ["198.51.100.0/24"]}))
    (cluster,) = rendered.of_type(policies.GKE_CLUSTER)
    assert cluster.inputs["privateClusterConfig"]["enablePrivateEndpoint"] is False
    assert cluster.inputs["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "198.51.100.0/24", "displayName": "authorized 198.51.100.0/24"}],
        "gcpPublicCidrsAccessEnabled": False}
    assert policies.closed_clusters(rendered.resources) == []
    error = config_error_before_any_resource("gke", gke_values(cluster={"authorizedNetworks": ["0.0.0.0/0"]}))
    assert "cluster.authorizedNetworks" in error and "lets everyone in" in error, error


def test_every_object_validates_against_the_real_schemas(gke_stack, validate_crd):
    assert validate_all(gke_stack, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    assert policies.violations(gke_stack.objects) == []


def test_the_stack_enables_every_api_it_needs_and_leaves_them_on_when_destroyed(gke_stack):
    services = {service.inputs["service"]: service.inputs for service in gke_stack.of_type(SERVICE)}
    assert set(services) == set(GCP_APIS)
    for api, inputs in services.items():
        assert inputs["project"] == PROJECT, api
        assert inputs["disableOnDestroy"] is False and inputs["disableDependentServices"] is False, api
    assert not rendered_stack("local", render.pulumi_values(LOCAL_STACK_FILE)).of_type(SERVICE)


def waits_for(resource: Declared, by_name: dict[str, Declared]) -> set[str]:
    """Names of everything created before `resource`: its dependencies and its parent, and theirs."""
    found: set[str] = set()
    pending = [resource]
    while pending:
        current = pending.pop()
        for name in {*current.depends_on, current.parent} - found - {""}:
            found.add(name)
            pending += [by_name[name]] if name in by_name else []
    return found


def test_every_google_resource_waits_for_the_apis(gke_stack):
    by_name = {resource.name: resource for resource in gke_stack.resources}
    assert len(by_name) == len(gke_stack.resources)  # dependencies are by name: names must be unique
    services = {service.name for service in gke_stack.of_type(SERVICE)}
    assert len(services) == len(GCP_APIS)
    # Every Google resource, and the image pushes to Artifact Registry.
    google = [resource for resource in gke_stack.resources if resource.type != SERVICE
              and (resource.type.startswith("gcp:") or resource.type == render.IMAGE_BUILD)]
    assert len(google) >= 15
    for resource in google:
        assert services <= waits_for(resource, by_name), resource.name


def types_without_their_api(resources: list[Declared]) -> set[str]:
    """The Google resource types among `resources` whose module MODULE_APIS does not know, or whose
    API GCP_APIS lacks."""
    return {resource.type for resource in resources if resource.type.startswith("gcp:")
            and resource.type != SERVICE
            and MODULE_APIS.get(resource.type.split(":")[1].split("/")[0]) not in GCP_APIS}


def test_every_google_resource_type_has_its_api_in_the_list(gke_stack):
    assert types_without_their_api(gke_stack.resources) == set()
    # A new kind of resource fails until its API is in GCP_APIS (and its module in MODULE_APIS).
    topic = Declared("gcp:pubsub/topic:Topic", "topic", {}, True)
    address = Declared("gcp:compute/globalAddress:GlobalAddress", "address", {}, True)
    assert types_without_their_api([topic, address]) == {"gcp:pubsub/topic:Topic"}


def test_the_bucket_is_private_versioned_and_forgets_old_checkpoints(gke_stack):
    assert policies.cloud_violations(gke_stack.resources) == []
    (bucket,) = gke_stack.of_type(policies.BUCKET)
    rules = bucket.inputs["lifecycleRules"]
    assert {"action": {"type": "Delete"},
            "condition": {"age": 30.0, "matchesPrefixes": ["checkpoints/"]}} in rules
    assert not gke_stack.of_type(policies.SERVICE_ACCOUNT_KEY)
    careless = Declared(policies.BUCKET, "open", {"publicAccessPrevention": "inherited"}, True)
    key = Declared(policies.SERVICE_ACCOUNT_KEY, "key", {}, True)
    assert len(policies.cloud_violations([careless, key])) == 4  # the policies are not blind


def test_destroy_leaves_the_bucket_and_the_artifacts_folder_with_their_data_and_deletes_the_rest(gke_stack):
    """GCS refuses to delete a bucket or a managed folder that holds objects (pulumi-gcp 10.2.0 Bucket
    and ManagedFolder: force_destroy false), so a destroy that tried would stop there; the data is
    meant to outlive the stack (docs/guides/deploy-gke.md#teardown): both are forgotten, not deleted."""
    retained = {(r.type, r.name) for r in gke_stack.resources if r.retained_on_delete}
    assert retained == {(policies.BUCKET, "storage-bucket"),
                        ("gcp:storage/managedFolder:ManagedFolder", "tracking-database-artifacts")}, retained
    for resource in gke_stack.resources:
        assert not resource.inputs.get("forceDestroy"), resource.name  # nothing deletes the data


def test_workload_identity_binds_every_account_that_uses_the_bucket(gke_stack):
    (account,) = [a for a in gke_stack.of_type(ACCOUNT) if a.name == "storage-service-account"]
    email = f"{account.inputs['accountId']}@{PROJECT}.iam.gserviceaccount.com"
    (grant,) = gke_stack.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert grant.inputs["role"] == "roles/storage.objectAdmin"
    assert grant.inputs["member"] == f"serviceAccount:{email}"
    assert grant.inputs["bucket"] == f"{PROJECT}-dist-ml"  # that bucket only
    members = {r.inputs["member"] for r in gke_stack.of_type("gcp:serviceaccount/iAMMember:IAMMember")
               if r.inputs["role"] == "roles/iam.workloadIdentityUser"}
    users = ("dist-ml-pipeline", "dist-ml-trainer", "dist-ml-predictor", "dist-ml-logger")
    # The tracking server's account is bound to its own Google account (infra/cloud_sql.py), not this one.
    assert members == {f"serviceAccount:{PROJECT}.svc.id.goog[dist-ml/{name}]"
                       for name in (*users, "dist-ml-mlflow")}
    accounts = {o["metadata"]["name"]: o for o in objects_of(gke_stack, "ServiceAccount")}
    for name in users:
        assert accounts[name]["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
    (template,) = objects_of(gke_stack, "WorkflowTemplate")
    assert embedded(template, "serve")["spec"]["predictor"]["serviceAccountName"] == "dist-ml-predictor"


ANSWERED_POOL = "pool-as-gke-reports-it.svc.id.goog"


class ClusterReportsItsPool(render.RecordingMocks):
    """GKE's answer for the cluster's identity pool, distinct from what the program asked for: a member
    built from the answer can only come from the cluster's output."""

    def new_resource(self, args):
        resource_id, state = super().new_resource(args)
        if args.typ == "gcp:container/cluster:Cluster":
            state = {**state, "workloadIdentityConfig": {"workloadPool": ANSWERED_POOL}}
        return resource_id, state


def test_workload_identity_bindings_wait_for_the_cluster_that_creates_the_identity_pool(monkeypatch):
    monkeypatch.setattr(render, "RecordingMocks", ClusterReportsItsPool)
    rendered = render.render("gke", gke_values())
    bindings = rendered.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    members = {binding.inputs["member"] for binding in bindings}
    assert f"serviceAccount:{ANSWERED_POOL}[dist-ml/dist-ml-pipeline]" in members
    (cluster,) = rendered.of_type("gcp:container/cluster:Cluster")
    for binding in bindings:
        assert re.fullmatch(rf"serviceAccount:{re.escape(ANSWERED_POOL)}\[dist-ml/[-a-z0-9]+\]",
                            binding.inputs["member"]), binding.name
        assert cluster.name in binding.depends_on, binding.name


def test_pipeline_pods_mount_the_bucket_where_the_local_stack_mounts_its_volume(gke_stack):
    pod = training_pod(gke_stack)
    assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    (volume,) = pod["spec"]["volumes"]
    assert volume["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
    assert volume["csi"]["volumeAttributes"]["bucketName"] == f"{PROJECT}-dist-ml"
    assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "storage", "mountPath": "/mnt/dist-ml"}]
    (template,) = objects_of(gke_stack, "WorkflowTemplate")
    assert template["spec"]["podMetadata"] == {"annotations": {"gke-gcsfuse/volumes": "true"}}
    env = embedded(template, "serve")["spec"]["predictor"]["containers"][0]["env"]
    assert {"name": "STORAGE_URI",
            "value": f"gs://{PROJECT}-dist-ml/releases/fmnist/{stack_checks.PUBLISHED_VERSION}"} in env


def test_pods_use_the_pushed_images_by_digest(gke_stack):
    image = training_pod(gke_stack)["spec"]["containers"][0]["image"]
    registry = rf"us-central1-docker\.pkg\.dev/{PROJECT}/dist-ml"
    pushed = r":[0-9a-f]{12}@sha256:[0-9a-f]{64}"  # the tag, and the digest it was pushed with
    assert re.fullmatch(rf"{registry}/trainer{pushed}", image)
    (template,) = objects_of(gke_stack, "WorkflowTemplate")
    isvc = embedded(template, "serve")
    assert re.fullmatch(rf"{registry}/serving{pushed}", isvc["spec"]["predictor"]["containers"][0]["image"])
    serve = [t for t in template["spec"]["templates"] if t["name"] == "serve"][0]
    assert re.fullmatch(rf"{registry}/serving{pushed}", serve["container"]["image"])


def pools_of(rendered: render.Rendered) -> dict[str, dict]:
    return {r.name: r.inputs for r in rendered.of_type(NODE_POOL)}


def trainer_resources(pod: dict) -> dict:
    (trainer,) = pod["spec"]["containers"]
    return trainer["resources"]


def test_node_pools_follow_the_config_and_only_gpu_pools_bring_gpu_tolerations(gke_stack):
    pools = pools_of(gke_stack)
    assert set(pools) == {"cluster-cpu-pool", "cluster-spot-pool"}  # Pulumi.gke.yaml: gpu disabled
    assert pools["cluster-spot-pool"]["nodeConfig"]["spot"] is True
    assert pools["cluster-cpu-pool"]["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert GPU_TOLERATION not in training_pod(gke_stack)["spec"].get("tolerations", [])

    # No trainingPool: with a GPU pool, training goes there.
    rendered = rendered_stack("gke", gke_values(cluster={"kind": "gke", "trainingPool": None, "nodePools": {
        "cpu": {"machineType": "e2-standard-8", "minNodes": 2, "maxNodes": 7},
        "gpu": {"enabled": True, "acceleratorType": "nvidia-l4", "acceleratorCount": 2,
                "machineType": "g2-standard-24", "maxNodes": 3}}}))
    pools = pools_of(rendered)
    assert set(pools) == {"cluster-cpu-pool", "cluster-gpu-pool"}
    assert pools["cluster-cpu-pool"]["autoscaling"] == {"totalMinNodeCount": 2, "totalMaxNodeCount": 7}
    gpu = pools["cluster-gpu-pool"]["nodeConfig"]
    # The driver set, not left to the GKE version's default (docs/guides/deploy-gke.md#gpus).
    assert gpu["guestAccelerators"] == [{"type": "nvidia-l4", "count": 2,
                                         "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"}}]
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert gpu["labels"] == {"dist-ml/pool": "gpu"}
    pod = training_pod(rendered)
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]
    assert pod["spec"]["nodeSelector"] == {"dist-ml/pool": "gpu"}
    resources = trainer_resources(pod)
    # All of a node's GPUs, requested as limited: Kubernetes refuses extended resources otherwise.
    assert resources["limits"]["nvidia.com/gpu"] == 2 and resources["requests"]["nvidia.com/gpu"] == 2


GPU_STACK = {"kind": "gke", "trainingPool": None, "nodePools": {"spot": {"enabled": False}, "gpu": {
    "enabled": True, "acceleratorType": "nvidia-l4", "acceleratorCount": 2, "machineType": "g2-standard-24",
    "driverVersion": "LATEST"}}}
REGISTRY = rf"us-central1-docker\.pkg\.dev/{PROJECT}/dist-ml"
PUSHED = r":[0-9a-f]{12}@sha256:[0-9a-f]{64}"  # the tag, and the digest it was pushed with


@pytest.fixture(scope="module")
def gpu_stack() -> render.Rendered:
    return rendered_stack("gke", gke_values(cluster=GPU_STACK))


def queued_gpu_stack(**gpu: object) -> render.Rendered:
    pools = GPU_STACK["nodePools"]
    return rendered_stack("gke", gke_values(cluster={**GPU_STACK, "nodePools": {
        **pools, "gpu": {**pools["gpu"], "queuedProvisioning": True, **gpu}}}))


def test_queued_gpus_come_through_kueues_provisioning_check_and_gkes_queued_provisioning(
        validate_crd, gpu_stack):
    """The pool as GKE's queued provisioning requires it (kubernetes-engine/docs/how-to/
    provisioningrequest: queued provisioning and flex-start, autoscaling from zero with the ANY
    location policy, no reservation, no auto-repair); the queue's GPU flavor behind Kueue's
    provisioning check. Kueue's own code accepts the check and creates the request in the tier
    (tests/cluster/test_gke_placement.py)."""
    rendered = queued_gpu_stack()
    assert validate_all(rendered, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    pools = {pool.name: pool.inputs for pool in rendered.of_type("gcp:container/nodePool:NodePool")}
    gpu = pools["cluster-gpu-pool"]
    assert gpu["queuedProvisioning"] == {"enabled": True}
    assert gpu["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 3, "locationPolicy": "ANY"}
    assert gpu["management"]["autoRepair"] is False
    assert gpu["nodeConfig"]["flexStart"] is True
    assert gpu["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert "queuedProvisioning" not in pools["cluster-cpu-pool"]
    objects = {o["kind"]: o for o in rendered.objects}
    config, check = objects["ProvisioningRequestConfig"], objects["AdmissionCheck"]
    assert config["spec"] == {"provisioningClassName": "queued-provisioning.gke.io",
                              "managedResources": ["nvidia.com/gpu"]}
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"]["name"] == config["metadata"]["name"]
    strategy = objects["ClusterQueue"]["spec"]["admissionChecksStrategy"]
    assert strategy == {"admissionChecks": [{"name": check["metadata"]["name"],
                                             "onFlavors": [objects["ResourceFlavor"]["metadata"]["name"]]}]}
    (on_demand,) = [o for o in gpu_stack.objects if o["kind"] == "ClusterQueue"]
    assert "admissionChecksStrategy" not in on_demand["spec"]


# --- GKE facts no code here can run: settled from GKE's documentation (docs/guides/deploy-gke.md) ----

def test_the_only_firewall_rule_opens_the_webhooks_ports_to_the_control_plane(gke_stack, public_gke_stack):
    """GKE opens the way from the internal Gateway's proxies (gke-l7-rilb, in the proxy-only subnet) to
    the predictor pods itself: "GKE creates firewall rules automatically when creating the following
    resources: GKE clusters, GKE Services, GKE Gateways and HTTPRoutes, GKE Ingresses"
    (https://cloud.google.com/kubernetes-engine/docs/concepts/firewall-rules, "Automatically created
    firewall rules": gkegw1-l7-<network>-<region> allows the proxy-only subnet to the pods' ports).
    For the control plane it opens tcp 443 and 10250 only: the one rule of ours lets the control
    plane's range (the subnet its endpoint is provisioned in) reach the ports the installs name, on
    the nodes of every pool; the tier holds that list to what the installed platform serves
    (tests/e2e_node/test_pulumi.py)."""
    for rendered in (gke_stack, public_gke_stack):
        (rule,) = rendered.of_type("gcp:compute/firewall:Firewall")
        assert rule.inputs["direction"] == "INGRESS"
        assert rule.inputs["sourceRanges"] == [network.CONTROL_PLANE_RANGE]
        (allowed,) = rule.inputs["allows"]
        assert allowed["protocol"] == "tcp" and "9443" in allowed["ports"] and "6443" in allowed["ports"]
        assert allowed["ports"] == [str(port) for port in platform_ports(gke_config_of(gke_values()))]
        (cluster,) = rendered.of_type("gcp:container/cluster:Cluster")
        subnets = {subnet.inputs["name"]: subnet
                   for subnet in rendered.of_type("gcp:compute/subnetwork:Subnetwork")}
        endpoint_subnet = subnets[cluster.inputs["privateClusterConfig"]["privateEndpointSubnetwork"]]
        assert endpoint_subnet.inputs["ipCidrRange"] == network.CONTROL_PLANE_RANGE
        for pool in rendered.of_type("gcp:container/nodePool:NodePool"):
            assert set(rule.inputs["targetTags"]) <= set(pool.inputs["nodeConfig"]["tags"]), pool.name
        assert policies.closed_firewalls(rendered.resources) == []


def test_the_webhooks_ports_follow_the_installs():
    """KEDA's metrics API server and webhooks only when serving scales on load; cert-manager's when the
    stack installs it."""
    values = gke_values()
    with_keda = platform_ports(gke_config_of(values))
    values["dist-ml:serving"] = json.dumps({**json.loads(values["dist-ml:serving"]), "autoscaling": {
        "metric": "cpu"}})
    assert 6443 in with_keda and 6443 not in platform_ports(gke_config_of(values))


def test_the_gpu_pool_declares_gkes_own_gpu_taint_exactly(gpu_stack):
    """GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule only in some cases ("When you add a GPU
    node pool to an existing cluster that already runs a non-GPU node pool, GKE automatically taints
    the GPU nodes", https://cloud.google.com/kubernetes-engine/docs/how-to/gpus#taint), so the pool
    declares it, with GKE's own key, value and effect: the provider reports drift only on the taints
    it manages (Pulumi GCP nodeConfig.taints: "This field will only report drift on taint keys that are
    already managed with Pulumi, use effectiveTaints to view the list of GKE-managed taints"), so the
    taint GKE would add is the same one and `pulumi up` shows no diff; another value for the same key
    and effect is GKE's "Found more than one taint with key nvidia.com/gpu" error
    (hashicorp/terraform-provider-google#7928)."""
    assert pools_of(gpu_stack)["cluster-gpu-pool"]["nodeConfig"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]


def test_the_gpu_pool_has_its_driver_installed_as_configured(gpu_stack):
    (accelerator,) = pools_of(gpu_stack)["cluster-gpu-pool"]["nodeConfig"]["guestAccelerators"]
    assert accelerator["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "LATEST"}


def test_training_pods_on_gpus_run_the_gpu_image_ask_for_every_gpu_and_check_them(gpu_stack, validate_crd):
    from trainer import train

    builds = {r.name: r.inputs for r in gpu_stack.of_type(render.IMAGE_BUILD)}
    assert set(builds) == {"images-trainer", "images-serving", "images-tracking-server", "images-trainer-gpu"}
    assert builds["images-trainer-gpu"]["dockerfile"]["location"].endswith("trainer-gpu/Dockerfile")
    assert re.fullmatch(rf"{REGISTRY}/trainer-gpu{PUSHED}", gpu_stack.outputs["images"]["trainerGpu"])
    (template,) = objects_of(gpu_stack, "WorkflowTemplate")
    for step in TRAIN_STEPS:
        pod = training_pod(gpu_stack, step)
        (container,) = pod["spec"]["containers"]
        assert re.fullmatch(rf"{REGISTRY}/trainer-gpu{PUSHED}", container["image"]), step
        # requests = limits = the node's GPUs (Kubernetes refuses extended resources otherwise).
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 2, step
        assert container["resources"]["requests"]["nvidia.com/gpu"] == 2, step
        assert pod["spec"]["tolerations"] == [GPU_TOLERATION] and pod["spec"]["nodeSelector"] == {
            "dist-ml/pool": "gpu"}, step
        # The trainer is told its GPUs, so that it refuses to train without them.
        assert container["command"][:3] == ["python", "-m", "trainer.train"]
        assert train.parse_args(container["command"][3:]).gpus == 2, step
    steps = {t["name"]: t for t in template["spec"]["templates"]}
    for step in ("ingest", "select"):  # no GPU: the CPU trainer image
        assert re.fullmatch(rf"{REGISTRY}/trainer{PUSHED}", steps[step]["container"]["image"]), step
    assert validate_all(gpu_stack, validate_crd, "v4", KUBERNETES_MINOR) >= 15


def test_only_training_pods_ask_for_gpus(gpu_stack):
    """Every nvidia.com/gpu request or limit anywhere in the stack is a training node's: in each
    TrainJob's resourcesPerNode and in the runtime's node container; and the queue's quota."""
    asked = [path for resource in gpu_stack.resources for path in flatten(resource.inputs)
             if path.endswith(".nvidia.com/gpu")]
    in_trainjobs = [path for path in asked if ".spec.trainer.resourcesPerNode." in path]
    in_runtime = [path for path in asked if ".replicatedJobs[0].template.spec.template.spec.containers[0]"
                  ".resources." in path]
    assert len(in_trainjobs) == 2 * len(TRAIN_STEPS)  # requests and limits, one TrainJob per variant
    assert len(in_runtime) == 2 and sorted(in_trainjobs + in_runtime) == sorted(asked)
    (runtime,) = objects_of(gpu_stack, "ClusterTrainingRuntime")
    assert runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"


def test_without_gpus_to_train_on_no_gpu_image_is_built(gke_stack):
    assert "images-trainer-gpu" not in {r.name for r in gke_stack.of_type(render.IMAGE_BUILD)}
    assert "trainerGpu" not in gke_stack.outputs["images"]
    # A gpu pool that training does not use (trainingPool: spot) builds none either.
    spot = rendered_stack("gke", gke_values(cluster={"kind": "gke", "trainingPool": "spot", "nodePools": {
        "spot": {"enabled": True}, "gpu": {"enabled": True}}}))
    assert "images-trainer-gpu" not in {r.name for r in spot.of_type(render.IMAGE_BUILD)}
    assert "--gpus" not in training_pod(spot)["spec"]["containers"][0]["command"]


def test_training_runs_on_the_spot_pool_when_there_is_one_and_on_demand_otherwise(gke_stack):
    pools = pools_of(gke_stack)
    assert pools["cluster-spot-pool"]["nodeConfig"]["labels"] == {"dist-ml/pool": "spot"}
    for step in TRAIN_STEPS:
        pod = training_pod(gke_stack, step)
        assert pod["spec"]["nodeSelector"] == {"dist-ml/pool": "spot"}, step
        assert pod["spec"]["tolerations"] == [SPOT_TOLERATION], step
        assert not {"nvidia.com/gpu"} & set(trainer_resources(pod)["limits"]), step

    on_demand = rendered_stack("gke", gke_values(cluster={
        "kind": "gke", "trainingPool": None, "nodePools": {"spot": {"enabled": False}}}))
    assert set(pools_of(on_demand)) == {"cluster-cpu-pool"}
    pod = training_pod(on_demand)
    assert pod["spec"]["nodeSelector"] == {"dist-ml/pool": "cpu"}
    assert "tolerations" not in pod["spec"]

    # Chosen explicitly: the on-demand pool although a spot pool exists.
    chosen = rendered_stack("gke", gke_values(cluster={"kind": "gke", "trainingPool": "cpu"}))
    assert "cluster-spot-pool" in pools_of(chosen)
    assert training_pod(chosen)["spec"]["nodeSelector"] == {"dist-ml/pool": "cpu"}
    assert "tolerations" not in training_pod(chosen)["spec"]


def embedded_argument(args: list[str]) -> dict:
    """The object a cluster step's container applies (`--manifest JSON`)."""
    return json.loads(args[args.index(cluster_names.MANIFEST_FLAG) + 1])


TRAINING_OBJECTS = ("ClusterTrainingRuntime", "ResourceFlavor", "TFJob")


def training_pool_tolerations(node: object, in_training: bool = False) -> list[tuple[bool, dict]]:
    """(inside a training object?, toleration) for every toleration of a spot or GPU taint under `node`,
    with Argo's embedded manifests opened: the training runtime's, Kueue's flavor's, a TFJob's."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            embeds = key == "args" and isinstance(value, list) and cluster_names.MANIFEST_FLAG in value
            if key == "manifest" and isinstance(value, str) or embeds:
                manifest = yaml.safe_load(value) if key == "manifest" else embedded_argument(value)
                inside = in_training or manifest.get("kind") in TRAINING_OBJECTS
                found += training_pool_tolerations(manifest, inside)
            elif key == "tolerations" and isinstance(value, list):
                found += [(in_training, t) for t in value if t.get("key") in TRAINING_TAINT_KEYS]
            else:
                found += training_pool_tolerations(value, in_training or node.get("kind") in TRAINING_OBJECTS)
    elif isinstance(node, list):
        for item in node:
            found += training_pool_tolerations(item, in_training)
    return found


def test_only_training_pods_tolerate_the_spot_and_gpu_taints_and_the_cpu_pool_stays_up():
    rendered = rendered_stack("gke", gke_values(cluster={"kind": "gke", "trainingPool": "gpu", "nodePools": {
        "spot": {"enabled": True}, "gpu": {"enabled": True}}}))
    found = [entry for resource in rendered.resources for entry in training_pool_tolerations(resource.inputs)]
    # The search sees the training pods' tolerations, in their runtime and Kueue's flavor (so it is not
    # blind), and nothing else's.
    assert [toleration for in_training, toleration in found if in_training] == [GPU_TOLERATION] * 2
    assert [toleration for in_training, toleration in found if not in_training] == []
    (logger,) = [d for d in objects_of(rendered, "Deployment") if "logger" in d["metadata"]["name"]]
    assert "tolerations" not in logger["spec"]["template"]["spec"]
    for isvc in objects_of(rendered, "InferenceService"):  # the stack's, if it declares one
        assert "tolerations" not in isvc["spec"]["predictor"]
    # System pods and the platform land on the cpu pool: untainted, never scaled to zero.
    cpu = pools_of(rendered)["cluster-cpu-pool"]
    assert cpu["nodeConfig"]["taints"] == [] and cpu["autoscaling"]["totalMinNodeCount"] >= 1
    tainted = {name: pool["nodeConfig"]["taints"] for name, pool in pools_of(rendered).items()}
    assert {key["key"] for key in tainted["cluster-spot-pool"]} == {SPOT_TOLERATION["key"]}
    assert {key["key"] for key in tainted["cluster-gpu-pool"]} == {GPU_TOLERATION["key"]}


def test_nodes_have_their_own_service_account_that_may_pull_from_the_repository_before_they_start(gke_stack):
    (node_account,) = [a for a in gke_stack.of_type(ACCOUNT) if a.name == "cluster-node-service-account"]
    assert node_account.inputs["accountId"] == "dist-ml-nodes"
    email = f"dist-ml-nodes@{PROJECT}.iam.gserviceaccount.com"
    (repository,) = gke_stack.of_type("gcp:artifactregistry/repository:Repository")
    (reader,) = gke_stack.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert reader.inputs == {"project": PROJECT, "location": "us-central1",
                             "repository": repository.inputs["repositoryId"],
                             "role": "roles/artifactregistry.reader", "member": f"serviceAccount:{email}"}
    project_grants = [grant for grant in gke_stack.of_type("gcp:projects/iAMMember:IAMMember")
                      if grant.inputs["member"] == f"serviceAccount:{email}"]
    # GKE's least-privilege role for node service accounts (logs, metrics, autoscaling), nothing more.
    assert {(g.inputs["role"], g.inputs["member"], g.inputs["project"]) for g in project_grants} == {
        ("roles/container.defaultNodeServiceAccount", f"serviceAccount:{email}", PROJECT)}
    pools = gke_stack.of_type(NODE_POOL)
    assert len(pools) == 2
    for pool in pools:
        assert pool.inputs["nodeConfig"]["serviceAccount"] == email, pool.name
        assert {reader.name, *(g.name for g in project_grants)} <= pool.depends_on, pool.name
    # The bucket is the workloads' business, through Workload Identity, not the nodes'.
    (grant,) = gke_stack.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert email not in grant.inputs["member"]


def test_images_are_built_for_the_nodes_platform_whatever_machine_builds_them(gke_stack):
    builds = {r.name: r.inputs for r in gke_stack.of_type(render.IMAGE_BUILD)}
    assert set(builds) == {"images-trainer", "images-serving", "images-tracking-server"}
    (repository,) = gke_stack.of_type("gcp:artifactregistry/repository:Repository")
    for name, inputs in builds.items():
        # BuildKit builds for the platform given (a change of platform is a new build) and pushes.
        assert inputs["platforms"] == ["linux/amd64"] and inputs["push"] is True, name
        (registry,) = inputs["registries"]
        assert registry["address"] == "us-central1-docker.pkg.dev"
        assert registry["username"] == "oauth2accesstoken"
        assert inputs["tags"][0].startswith(f"us-central1-docker.pkg.dev/{PROJECT}/dist-ml/")
        assert inputs["dockerfile"]["location"].endswith(f"{name.removeprefix('images-')}/Dockerfile")
        (build,) = [r for r in gke_stack.of_type(render.IMAGE_BUILD) if r.name == name]
        assert repository.name in build.depends_on  # pushed once the repository exists


def test_monitoring_is_there_when_enabled_and_gone_when_disabled(gke_stack):
    monitors = [*objects_of(gke_stack, "PodMonitor"), *objects_of(gke_stack, "ServiceMonitor")]
    assert {m["metadata"]["name"] for m in monitors} == {"dist-ml-predictor", "kueue"}
    (dashboard,) = [config_map for config_map in objects_of(gke_stack, "ConfigMap")
                    if config_map["metadata"]["name"] == "dist-ml-dashboard"]
    panels = json.loads(dashboard["data"]["dist-ml.json"])["panels"]
    assert [p["title"] for p in panels] == ["Request rate", "Latency", "Predictor replicas", "Training queue"]
    queue = {target["legendFormat"]: target["expr"] for target in panels[3]["targets"]}
    assert queue == {"pending": 'sum(kueue_pending_workloads{cluster_queue="dist-ml-training"})',
                     "admitted": 'sum(kueue_admitted_active_workloads{cluster_queue="dist-ml-training"})'}
    (chart,) = [r for r in gke_stack.of_type("kubernetes:helm.sh/v4:Chart")
                if r.inputs["chart"] == "kube-prometheus-stack"]
    assert chart.inputs["version"] == "80.4.1"

    quiet = rendered_stack("gke", gke_values(monitoring={"enabled": False},
                                             serving={"autoscaling": {"metric": "cpu"}}))
    assert "dist-ml:infra:Monitoring" not in {r.type for r in quiet.resources}
    assert not objects_of(quiet, "PodMonitor") and not objects_of(quiet, "ServiceMonitor")


def flatten(node: object, path: str = "") -> dict[str, object]:
    """path -> leaf value, with Argo's embedded manifests (and the serve step's) opened."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in flatten(
            yaml.safe_load(value) if key == "manifest" else value, f"{path}.{key}").items()}
    if isinstance(node, list):
        flag = cluster_names.MANIFEST_FLAG
        manifest_at = node.index(flag) + 1 if flag in node else -1
        return {k: v for index, value in enumerate(node)
                for k, v in flatten(json.loads(value) if index == manifest_at else value,
                                    f"{path}[{index}]").items()}
    return {path: node}


# Where the two stacks may differ: images, storage (volume, mount annotations, URIs), the spot pool's
# toleration and node selector, the predictor's Workload Identity account.
EXPECTED_DIFFERENCES = re.compile(r"|".join([
    r".*\.image$", r".*\.volumes\[0\]\..*", r".*\.podMetadata\..*",
    r".*\.metadata\.annotations\.gke-gcsfuse.*",
    r".*\.tolerations\[\d+\]\..*", r".*\.nodeSelector\..*",
    r".*\.env\[0\]\.value$",
    r".*\.storageUri$",
]))


def test_both_stacks_declare_the_same_pipeline_and_rollout_but_for_storage_images_and_placement():
    local_values = render.pulumi_values(LOCAL_STACK_FILE)
    shared = {f"dist-ml:{section}": local_values[f"dist-ml:{section}"] for section in ("pipeline", "serving")}
    local = rendered_stack("local", local_values)
    gke = rendered_stack("gke", {**gke_values(), **shared})
    for kind in ("WorkflowTemplate", "Deployment"):
        # The tracking servers differ by design: SQLite on a volume, Cloud SQL through its proxy.
        (local_object,), (gke_object,) = (
            [o for o in objects_of(stack, kind) if o["metadata"]["name"] != SERVER_NAME]
            for stack in (local, gke))
        local_flat, gke_flat = flatten(local_object), flatten(gke_object)
        differing = {path for path in local_flat.keys() | gke_flat.keys()
                     if local_flat.get(path) != gke_flat.get(path)}
        assert differing, kind  # the images differ at least: the comparison sees something
        # Where the storage is, as the cluster names it (select's --releases-uri): the claim or the bucket.
        storage = {path for path in differing if str(local_flat.get(path)).startswith("pvc://dist-ml-storage/")
                   and str(gke_flat.get(path)).startswith(f"gs://{PROJECT}-dist-ml/")}
        unexpected = {path for path in differing - storage if not EXPECTED_DIFFERENCES.fullmatch(path)}
        assert unexpected == set(), kind


BAD_GKE_CONFIG = [
    ({"dist-ml:cluster": {"kind": "gke", "agents": 2}}, "cluster.agents: does not apply to cluster.kind gke"),
    ({"dist-ml:storage": {"size": "10Gi"}}, "storage.size: does not apply to cluster.kind gke"),
    ({"gcp:project": None}, "gcp:project: is required on the gke stack"),
    ({"gcp:region": None}, "gcp:region: is required on the gke stack"),
    ({"dist-ml:cluster": {"kind": "gke", "releaseChannel": "BETA"}},
     "cluster.releaseChannel: must be one of"),
    ({"dist-ml:cluster": {"kind": "gke", "nodePools": {"gpu": {"enabled": True, "acceleratorCount": 0}}}},
     "cluster.nodePools.gpu.acceleratorCount: must be >= 1"),
    ({"dist-ml:cluster": {"kind": "gke", "nodePools": {"cpu": {"minNodes": 3, "maxNodes": 1}}}},
     "cluster.nodePools.cpu.maxNodes: must be >= minNodes"),
    ({"dist-ml:cluster": {"kind": "gke", "nodePools": {"cpu": {"minNodes": 0}}}},
     "cluster.nodePools.cpu.minNodes: must be >= 1: system pods and the platform run only on the cpu pool"),
    ({"dist-ml:cluster": {"kind": "gke", "trainingPool": "gpu"}},
     "cluster.trainingPool: gpu needs cluster.nodePools.gpu.enabled: true"),
    ({"dist-ml:cluster": {"kind": "gke", "trainingPool": "spot", "nodePools": {"spot": {"enabled": False}}}},
     "cluster.trainingPool: spot needs cluster.nodePools.spot.enabled: true"),
    ({"dist-ml:cluster": {"kind": "gke", "trainingPool": "tpu"}}, "cluster.trainingPool: must be one of"),
    ({"dist-ml:cluster": {"kind": "gke", "name": "a-cluster-name-of-25-char"}},
     "cluster.name: must be a GKE cluster name: 1-24"),
    ({"dist-ml:cluster": {"kind": "gke", "location": "us-central"}}, "cluster.location: must be a region"),
    ({"dist-ml:cluster": {**GPU_STACK, "trainingPool": "cpu", "nodePools": {
        **GPU_STACK["nodePools"], "gpu": {**GPU_STACK["nodePools"]["gpu"], "queuedProvisioning": True}}}},
     "cluster.nodePools.gpu.queuedProvisioning: needs cluster.trainingPool gpu"),
    ({"dist-ml:cluster": {**GPU_STACK, "nodePools": {
        **GPU_STACK["nodePools"], "gpu": {**GPU_STACK["nodePools"]["gpu"], "queuedProvisioning": True}}},
      "dist-ml:pipeline": {**yaml.safe_load((REPO_ROOT / "Pulumi.gke.yaml").read_text())["config"][
          "dist-ml:pipeline"], "engine": "tfjob"}, "dist-ml:platform": None},
     "cluster.nodePools.gpu.queuedProvisioning: needs pipeline.engine trainjob"),
    ({"dist-ml:cluster": {"kind": "gke", "maintenance": {"windowEnd": "2026-01-03T04:00:00Z"}}},
     "cluster.maintenance.windowEnd: must be 4 to 24 hours after windowStart"),
    ({"dist-ml:cluster": {"kind": "gke", "maintenance": {"recurrence": "FREQ=WEEKLY;BYDAY=SU"}}},
     "cluster.maintenance.recurrence: gives 24 hours in 32 days; GKE requires at least 48"),
    ({"dist-ml:cluster": {"kind": "gke", "maintenance": {"recurrence": "FREQ=MONTHLY"}}},
     "cluster.maintenance.recurrence: must be FREQ=DAILY or FREQ=WEEKLY;BYDAY="),
    ({"dist-ml:cluster": {"kind": "gke", "maintenance": {"holdFrom": "2026-01-01"}}},
     "cluster.maintenance.holdFrom: must be a UTC time like"),
    *[({"dist-ml:cluster": {"kind": "gke", "endpoint": endpoint}}, message) for endpoint, message in (
        ({"public": True, "allowedSourceRanges": ["203.0.113.0/24"]},
         "cluster.endpoint.domain: is required with public: true: the endpoint serves HTTPS only"),
        ({"public": True, "domain": "models.example.com"},
         "cluster.endpoint.allowedSourceRanges: is required with public: true"),
        ({"public": True, "domain": "models.example.com", "allowedSourceRanges": ["0.0.0.0/0"]},
         "cluster.endpoint.allowedSourceRanges[0]: 0.0.0.0/0 lets everyone in"),
        ({"public": True, "domain": "models.example.com", "allowedSourceRanges": ["10.1.2.3/8"]},
         "cluster.endpoint.allowedSourceRanges[0]: must be an IPv4 range like 203.0.113.0/24, "
         "got '10.1.2.3/8' (10.1.2.3/8 has host bits set)"),
        ({"public": True, "domain": "models.example.com", "allowedSourceRanges": ["203.0.113.0"]},
         "cluster.endpoint.allowedSourceRanges[0]: must be an IPv4 range like 203.0.113.0/24"),
        ({"public": True, "domain": "*.example.com", "allowedSourceRanges": ["203.0.113.0/24"]},
         "cluster.endpoint.domain: must be a domain name like models.example.com"),
        ({"public": True, "domain": "localhost", "allowedSourceRanges": ["203.0.113.0/24"]},
         "cluster.endpoint.domain: must be a domain name like models.example.com"),
        ({"domain": "models.example.com"}, "cluster.endpoint.domain: applies only to a public endpoint"),
        ({"allowedSourceRanges": ["203.0.113.0/24"]},
         "cluster.endpoint.allowedSourceRanges: applies only to a public endpoint"),
        ({"public": "yes"}, "cluster.endpoint.public: must be true or false"),
    )],
    *[({"gcp:project": project}, "gcp:project: must be your GCP project id")
      for project in ("my-gcp-project", "YOUR-PROJECT", "proj1", "ends-with-hyphen-", "9starts-with-digit",
                      "a-project-id-longer-than-thirty")],
    *[({"gcp:region": region}, "gcp:region: must be a GCP region like us-central1")
      for region in ("us-central1-a", "US-CENTRAL1", "europe", "us central1")],
]


@pytest.mark.parametrize(("changes", "message"), BAD_GKE_CONFIG,
                         ids=[m.split(":")[0] for _, m in BAD_GKE_CONFIG])
def test_bad_gke_config_fails_naming_the_key_before_any_resource(changes, message):
    values = stack_file_values()
    for key, value in changes.items():
        if value is None:
            values.pop(key)
        else:
            values[key] = json.dumps(value) if isinstance(value, dict) else value
    assert config_error_before_any_resource("gke", values).startswith(f"stack config: {message}")


PUBLIC_ENDPOINT = {"public": True, "domain": "models.example.com", "allowedSourceRanges": ["203.0.113.0/24"]}


@pytest.fixture(scope="module")
def public_gke_stack() -> render.Rendered:
    cluster = json.loads(stack_file_values()["dist-ml:cluster"])
    return rendered_stack("gke", gke_values(**{"cluster": {**cluster, "endpoint": PUBLIC_ENDPOINT}}))


def test_a_public_endpoints_objects_validate_and_its_google_resources_wait_for_their_apis(
        public_gke_stack, validate_crd):
    assert validate_all(public_gke_stack, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    kinds = {o["kind"] for o in public_gke_stack.objects}
    assert {"Gateway", "HTTPRoute", "GCPBackendPolicy"} <= kinds
    assert "GCPBackendPolicy" in stack_checks.UNCHECKED_KINDS  # no pinned schema: see stack_checks
    assert types_without_their_api(public_gke_stack.resources) == set()
    by_name = {resource.name: resource for resource in public_gke_stack.resources}
    services = {service.name for service in public_gke_stack.of_type(SERVICE)}
    endpoint = [r for r in public_gke_stack.resources if r.type.startswith(("gcp:certificatemanager/",
                                                                             "gcp:compute/"))
                and r.parent != "tracking-database"]
    assert len(endpoint) == 12  # network, 2 subnets (nodes, control plane), the webhooks' firewall rule,
    #                             router, NAT, address, authorization, certificate, map, entry, policy
    for resource in endpoint:
        assert services <= waits_for(resource, by_name), resource.name


def test_gcp_settings_on_the_local_stack_are_errors():
    values = {**render.pulumi_values(LOCAL_STACK_FILE), "gcp:project": "my-gcp-project"}
    assert config_error_before_any_resource("local", values).startswith(
        "stack config: gcp:project: applies only to cluster.kind gke")


def test_the_stack_file_has_no_placeholder_project_and_stops_at_once_until_one_is_set(tmp_path):
    values = render.pulumi_values(STACK_FILE)
    assert "gcp:project" not in values
    assert "pulumi config set --stack gke gcp:project" in STACK_FILE.read_text()  # the file says how
    assert config_error_before_any_resource("gke", values) == (
        "stack config: gcp:project: is required on the gke stack (pulumi config set gcp:project ...)")
    result = run_module("stacks.render", "--stack", "gke", "--out", tmp_path)
    assert result.returncode != 0
    assert "Pulumi.gke.yaml: gcp:project: is required on the gke stack" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_render_lists_the_google_cloud_resources_with_their_key_settings(gke_stack, tmp_path):
    render.write(gke_stack, tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r'gcp:storage/bucket:Bucket .*"publicAccessPrevention": "enforced"', summary)
    assert re.search(r'gcp:container/nodePool:NodePool +cluster-spot-pool .*"spot": true', summary)
    assert "kubeconfig: [secret]" in summary


def test_the_tracking_server_reaches_cloud_sql_privately_as_its_own_identity_without_a_password(gke_stack):
    """infra/cloud_sql.py and infra/tracking.py as declared; Cloud SQL itself cannot run here."""
    (instance,) = gke_stack.of_type(policies.SQL_INSTANCE)
    settings = instance.inputs["settings"]
    assert settings["ipConfiguration"]["ipv4Enabled"] is False
    assert settings["ipConfiguration"]["privateNetwork"] == "network-network-id"
    assert settings["connectorEnforcement"] == "REQUIRED"
    assert {"name": "cloudsql.iam_authentication", "value": "on"} in settings["databaseFlags"]
    assert "tracking-database-peering" in instance.depends_on  # private services access exists first
    (user,) = gke_stack.of_type(policies.SQL_USER)
    assert user.inputs["type"] == "CLOUD_IAM_SERVICE_ACCOUNT" and "password" not in user.inputs
    assert user.inputs["name"] == f"dist-ml-mlflow@{PROJECT}.iam"
    assert user.inputs["databaseRoles"] == ["cloudsqlsuperuser"]  # MLflow creates its own tables
    assert policies.private_databases(gke_stack.resources) == []
    (server,) = [d for d in objects_of(gke_stack, "Deployment") if d["metadata"]["name"] == SERVER_NAME]
    pod = server["spec"]["template"]["spec"]
    proxy, migrate = pod["initContainers"]
    assert proxy["restartPolicy"] == "Always"  # a native sidecar: up before the migration and the server
    assert {"--private-ip", "--auto-iam-authn"} <= set(proxy["args"])
    (mlflow,) = pod["containers"]
    args = {flag: mlflow["args"][i + 1] for i, flag in enumerate(mlflow["args"][:-1])
            if flag.startswith("--")}
    assert args["--backend-store-uri"] == (
        f"postgresql://dist-ml-mlflow%40{PROJECT}.iam@127.0.0.1:5432/mlflow")  # no password in it
    assert migrate["command"] == ["mlflow", "db", "upgrade", args["--backend-store-uri"]]
    assert "restartPolicy" not in migrate and migrate["image"] == mlflow["image"]
    assert args["--artifacts-destination"] == f"gs://{PROJECT}-dist-ml/mlflow"
    accounts = {o["metadata"]["name"]: o for o in objects_of(gke_stack, "ServiceAccount")}
    assert accounts["dist-ml-mlflow"]["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == (
        f"dist-ml-mlflow@{PROJECT}.iam.gserviceaccount.com")
    (service,) = [s for s in objects_of(gke_stack, "Service") if s["metadata"]["name"] == SERVER_NAME]
    assert service["spec"]["type"] == "ClusterIP"
    (template,) = objects_of(gke_stack, "WorkflowTemplate")
    select = next(t for t in template["spec"]["templates"] if t["name"] == "select")["container"]
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow.dist-ml.svc:5000"} in select["env"]


def test_the_deploy_guide_lists_every_api_the_stack_enables():
    """The guide's table is written by hand: a new API fails here until it has its row."""
    guide = (REPO_ROOT / "docs" / "guides" / "deploy-gke.md").read_text()
    listed = set(re.findall(r"^\| [^|]*\(`([a-z]+\.googleapis\.com)`\) \|", guide, re.MULTILINE))
    assert listed == set(GCP_APIS)
