"""A GKE cluster with Workload Identity, its node pools managed separately, the nodes' own service
account, and a provider for it.

Closed, as Google's own GKE base platform runs it (GoogleCloudPlatform/accelerated-platforms,
platforms/gke/base/core/container_cluster/container_cluster.tf):
- private nodes, on the cluster and every pool (no external address; egress through the network's
  Cloud NAT: infra/network.py);
- the control plane reached through its DNS-based endpoint, which checks the caller's IAM identity
  (`container.clusters.connect`) before Kubernetes' RBAC, from any network that reaches Google's APIs
  (kubernetes-engine/docs/concepts/network-isolation; `gcloud container clusters get-credentials
  --dns-endpoint`): a laptop and a GitHub runner deploy without a VPN. Its IP endpoint is private,
  unless `cluster.authorizedNetworks` names the ranges that may reach its public one;
- Dataplane V2 (`ADVANCED_DATAPATH`), which enforces every NetworkPolicy the stacks declare
  (kubernetes-engine/docs/concepts/dataplane-v2: "Kubernetes NetworkPolicy is always on");
- shielded nodes with secure boot and integrity monitoring
  (kubernetes-engine/docs/how-to/shielded-gke-nodes).
Each field as pulumi-gcp 10.2.0's container.Cluster and container.NodePool take it.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.network import PODS_RANGE_NAME, SERVICES_RANGE_NAME, GkeNetwork, node_tag

# GKE's own taint on GPU nodes, and ours on spot nodes: only training pods tolerate them.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NO_SCHEDULE"}
# The NVIDIA driver GKE installs on a GPU node (gpu_driver_installation_config): the DEFAULT or the
# LATEST one for the node's GKE version (LATEST on Container-Optimized OS only, the image the pools
# run). Left unset, GKE decides by its version: the provider's docs say it installs the default driver
# since 1.30.1-gke.1156000 and none before, the API reference still says none. A node without a driver
# never advertises nvidia.com/gpu, so the pods that ask for one wait until their step times out.
GPU_DRIVER_VERSIONS = ("DEFAULT", "LATEST")
# Queued provisioning (GKE's Dynamic Workload Scheduler, flex-start): the pool's nodes come only
# through ProvisioningRequests of this class, all of a request's nodes at once, for at most 7 days.
# What GKE requires of the pool (kubernetes-engine/docs/how-to/provisioningrequest, "Create a node
# pool"): queued provisioning and flex-start on, autoscaling from zero with the ANY location policy,
# no reservation, no auto-repair (a repair would replace a node the request holds).
QUEUED_PROVISIONING_CLASS = "queued-provisioning.gke.io"
QUEUED_LOCATION_POLICY = "ANY"
NO_RESERVATION = "NO_RESERVATION"
NODE_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]  # access is IAM's, via Workload Identity
KUBERNETES_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule"}
# Our label on every node, `dist-ml/pool: <pool name>`: GKE's own (cloud.google.com/gke-nodepool)
# carries the pool's autonamed name, which pods cannot know in advance.
POOL_LABEL = "dist-ml/pool"
# What GKE documents as the least a custom node service account needs on the project (logs, metrics,
# autoscaling signals), and what the nodes' kubelet needs to pull our images from the repository.
NODE_PROJECT_ROLES = ("roles/container.defaultNodeServiceAccount",)
IMAGE_READER_ROLE = "roles/artifactregistry.reader"
NODE_ACCOUNT_SUFFIX = "-nodes"  # the nodes' service account is <cluster name>-nodes
# GKE's Gateway controller, with the standard channel's CRDs (Gateway, HTTPRoute, ...), installed by GKE.
# It needs a VPC-native cluster and the HttpLoadBalancing add-on (on by default; said here).
GATEWAY_API_CHANNEL = "CHANNEL_STANDARD"
VPC_NATIVE = "VPC_NATIVE"
DATAPLANE_V2 = "ADVANCED_DATAPATH"  # the REST API's DatapathProvider for Dataplane V2
SHIELDED_INSTANCE = {"enable_secure_boot": True, "enable_integrity_monitoring": True}
# Minor upgrades held (kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions): the channel
# would move the cluster past the minor the stacks are tested on (common/kubernetes_support.py). The
# scope NO_MINOR_UPGRADES still lets patches in, on the control plane and the nodes; its end is the
# end of support of the cluster's minor (UNTIL_END_OF_SUPPORT, then GKE upgrades anyway). A stack's
# move to the next minor is a change of `cluster.kubernetesVersion` and of this constant's users.
HOLD_MINOR_UPGRADES = "NO_MINOR_UPGRADES"
UNTIL_END_OF_SUPPORT = "UNTIL_END_OF_SUPPORT"
HOLD_EXCLUSION_NAME = "hold-minor-upgrades"


# Memory per vCPU (GiB: Compute Engine's GB is 2**30 bytes) of the predefined machine types
# `<series>-<type>-<vCPUs>`, from Compute Engine's machine family pages; others need their size given.
MEMORY_PER_VCPU = {
    "e2": {"standard": 4, "highmem": 8, "highcpu": 1},
    "n1": {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9},
    "n2": {"standard": 4, "highmem": 8, "highcpu": 1}, "n2d": {"standard": 4, "highmem": 8, "highcpu": 1},
    "n4": {"standard": 4, "highmem": 8, "highcpu": 2}, "c2": {"standard": 4}, "c3": {"standard": 4},
    "g2": {"standard": 4},
}
# What GKE keeps of a Standard node for itself (its node allocatable page): of CPU, 6% of the first
# core, 1% of the second, 0.5% of the next two and 0.25% of the rest; of memory, 25% of the first
# 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112 and 2% of the rest, plus the
# kubelet's 100 MiB eviction threshold. Each as (up to this much, this share of it).
CPU_RESERVED = ((1, 0.06), (2, 0.01), (4, 0.005), (float("inf"), 0.0025))
MEMORY_RESERVED_GIB = ((4, 0.25), (8, 0.20), (16, 0.10), (128, 0.06), (float("inf"), 0.02))
EVICTION_THRESHOLD_GIB = 100 / 1024


def machine_size(machine_type: str) -> tuple[int, float] | None:
    """vCPUs and GiB of memory of a predefined machine type, None for one this table does not know."""
    series, _, rest = machine_type.partition("-")
    kind, _, vcpus = rest.partition("-")
    per_vcpu = MEMORY_PER_VCPU.get(series, {}).get(kind)
    if per_vcpu is None or not vcpus.isdigit():
        return None
    return int(vcpus), int(vcpus) * per_vcpu


def _reserved(amount: float, tiers: tuple[tuple[float, float], ...]) -> float:
    reserved, below = 0.0, 0.0
    for up_to, share in tiers:
        reserved += max(0.0, min(amount, up_to) - below) * share
        below = up_to
    return reserved


def allocatable(vcpus: int, memory_gib: float) -> tuple[float, float]:
    """What pods may request on one node: CPUs and GiB of memory."""
    return (vcpus - _reserved(vcpus, CPU_RESERVED),
            memory_gib - _reserved(memory_gib, MEMORY_RESERVED_GIB) - EVICTION_THRESHOLD_GIB)


def toleration(taint: dict) -> dict:
    """The Kubernetes toleration of a GKE node pool taint."""
    return {"key": taint["key"], "operator": "Equal", "value": taint["value"],
            "effect": KUBERNETES_TAINT_EFFECTS[taint["effect"]]}


def node_selector(pool_name: str) -> dict[str, str]:
    """The node selector of the pool's nodes."""
    return {POOL_LABEL: pool_name}


@dataclasses.dataclass(frozen=True)
class NodePoolArgs:
    machine_type: str
    min_nodes: int
    max_nodes: int
    spot: bool = False
    accelerator_type: str | None = None
    accelerator_count: int = 0
    gpu_driver_version: str = GPU_DRIVER_VERSIONS[0]  # with accelerators: the driver GKE installs
    queued_provisioning: bool = False  # nodes only through ProvisioningRequests (QUEUED_PROVISIONING_CLASS)

    @property
    def taints(self) -> list[dict]:
        return [*([GPU_TAINT] if self.accelerator_type else []), *([SPOT_TAINT] if self.spot else [])]

    @property
    def gpus(self) -> int:
        """The GPUs of one node, all of which a pod placed on it asks for."""
        return self.accelerator_count if self.accelerator_type else 0

    def autoscaling(self) -> dict:
        if self.queued_provisioning:
            return {"total_min_node_count": 0, "total_max_node_count": self.max_nodes,
                    "location_policy": QUEUED_LOCATION_POLICY}
        return {"total_min_node_count": self.min_nodes, "total_max_node_count": self.max_nodes}

    def queued(self) -> dict:
        """The pool's and its nodes' settings for queued provisioning (none without it)."""
        if not self.queued_provisioning:
            return {"pool": {}, "node": {}}
        return {"pool": {"queued_provisioning": {"enabled": True}},
                "node": {"flex_start": True,
                         "reservation_affinity": {"consume_reservation_type": NO_RESERVATION}}}

    def guest_accelerators(self) -> list[dict]:
        """The node config's accelerators: the GPUs, and the driver GKE installs for them."""
        if not self.accelerator_type:
            return []
        return [{"type": self.accelerator_type, "count": self.accelerator_count,
                 "gpu_driver_installation_config": {"gpu_driver_version": self.gpu_driver_version}}]


@dataclasses.dataclass(frozen=True)
class GkeClusterArgs:
    project: str
    name: str
    location: str  # a region: regional cluster; a zone: zonal
    release_channel: str
    kubernetes_version: str  # a minor, "1.35": the control plane's minimum; the channel upgrades it
    deletion_protection: bool
    node_pools: dict[str, NodePoolArgs]  # pool name -> settings; "cpu" always present
    image_repository: gcp.artifactregistry.Repository  # where the nodes pull the pods' images from
    network: GkeNetwork  # the VPC and the nodes' subnet, with the pods' and Services' ranges
    authorized_networks: tuple[str, ...] = ()  # who may reach the public IP endpoint; none: it is private
    maintenance: MaintenanceWindow | None = None  # None: GKE's any-time default
    hold_minor_upgrades_from: str | None = None  # RFC 3339; None: minor upgrades as the channel brings them


@dataclasses.dataclass(frozen=True)
class MaintenanceWindow:
    """A recurring window (RFC 3339 start and end of its first occurrence, an RFC 5545 RRULE)."""
    start: str
    end: str
    recurrence: str


def maintenance_policy(window: MaintenanceWindow | None, hold_from: str | None) -> dict | None:
    """When GKE may upgrade the cluster and its nodes, and the exclusion that holds minor upgrades
    until the minor's end of support."""
    if window is None and hold_from is None:
        return None
    policy: dict = {}
    if window is not None:
        policy["recurring_window"] = {"start_time": window.start, "end_time": window.end,
                                      "recurrence": window.recurrence}
    if hold_from is not None:
        policy["maintenance_exclusions"] = [{
            "exclusion_name": HOLD_EXCLUSION_NAME, "start_time": hold_from,
            "exclusion_options": {"scope": HOLD_MINOR_UPGRADES, "end_time_behavior": UNTIL_END_OF_SUPPORT}}]
    return policy


def control_plane_access(authorized_networks: tuple[str, ...], endpoint_subnet: pulumi.Input[str]) -> dict:
    """The cluster's control-plane endpoints: the DNS-based one open to IAM-authorized callers from
    anywhere; the IP-based one for the nodes, in `endpoint_subnet` (the range the webhooks' firewall
    rule lets in: infra/network.py), private unless `authorized_networks` may reach its public address
    (Google's own public ranges never)."""
    return {
        "control_plane_endpoints_config": {
            "dns_endpoint_config": {"allow_external_traffic": True},
            "ip_endpoints_config": {"enabled": True},
        },
        "private_cluster_config": {"enable_private_nodes": True,
                                   "enable_private_endpoint": not authorized_networks,
                                   "private_endpoint_subnetwork": endpoint_subnet},
        "master_authorized_networks_config": {
            "cidr_blocks": [{"cidr_block": block, "display_name": f"authorized {block}"}
                            for block in authorized_networks],
            "gcp_public_cidrs_access_enabled": False,
        },
    }


def kubeconfig(name: str, dns_endpoint: str) -> str:
    """A kubeconfig for the cluster's DNS-based endpoint (its certificate is publicly trusted, so no CA
    is given), authenticating with gke-gcloud-auth-plugin: no static credentials, what
    `gcloud container clusters get-credentials --dns-endpoint` writes."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: https://{dns_endpoint}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}
current-context: {name}
users:
- name: {name}
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: gke-gcloud-auth-plugin
      installHint: Install gke-gcloud-auth-plugin (gcloud components install gke-gcloud-auth-plugin)
      provideClusterInfo: true
"""


class GkeCluster(pulumi.ComponentResource):
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:GkeCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster = gcp.container.Cluster(
            f"{name}-cluster",
            name=args.name,
            project=args.project,
            location=args.location,
            # Node pools are separate resources: GKE needs one node to create a cluster, then drops it.
            remove_default_node_pool=True,
            initial_node_count=1,
            deletion_protection=args.deletion_protection,
            release_channel={"channel": args.release_channel},
            # The minor the stack's objects are written for: GKE takes a minor for the newest patch its
            # channel offers (https://cloud.google.com/kubernetes-engine/versioning#specifying_cluster_version).
            min_master_version=args.kubernetes_version,
            maintenance_policy=maintenance_policy(args.maintenance, args.hold_minor_upgrades_from),
            workload_identity_config={"workload_pool": f"{args.project}.svc.id.goog"},
            addons_config={"gcs_fuse_csi_driver_config": {"enabled": True},
                           "http_load_balancing": {"disabled": False}},
            # The rollout's HTTPRoute splits requests between the stable and the canary predictor.
            gateway_api_config={"channel": GATEWAY_API_CHANNEL},
            network=args.network.network.id,
            subnetwork=args.network.nodes.id,
            networking_mode=VPC_NATIVE,
            ip_allocation_policy={"cluster_secondary_range_name": PODS_RANGE_NAME,
                                  "services_secondary_range_name": SERVICES_RANGE_NAME},
            datapath_provider=DATAPLANE_V2,
            enable_shielded_nodes=True,
            **control_plane_access(args.authorized_networks, args.network.control_plane.name),
            # Private nodes pull what is outside Google through the network's NAT, from their start.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.network.nat]),
        )
        node_account, node_grants = self._node_service_account(name, args, child)
        self.node_pools = [
            gcp.container.NodePool(
                f"{name}-{pool_name}-pool",
                project=args.project,
                cluster=cluster.name,
                location=args.location,
                autoscaling=pool.autoscaling(),
                management={"auto_repair": not pool.queued_provisioning, "auto_upgrade": True},
                **pool.queued()["pool"],
                network_config={"enable_private_nodes": True},
                node_config={
                    "machine_type": pool.machine_type,
                    "spot": pool.spot,
                    # Not the Compute Engine default account, which may be missing, disabled, or an editor.
                    "service_account": node_account.email,
                    "oauth_scopes": NODE_SCOPES,
                    # Pods get Google credentials from their Kubernetes service account, never the node's.
                    "workload_metadata_config": {"mode": "GKE_METADATA"},
                    "labels": node_selector(pool_name),
                    "tags": [node_tag(args.name)],  # what the webhooks' firewall rule targets
                    "taints": pool.taints,
                    "guest_accelerators": pool.guest_accelerators(),
                    "shielded_instance_config": SHIELDED_INSTANCE,
                    **pool.queued()["node"],
                },
                # Nodes without their grants would start unable to pull images or write logs.
                opts=pulumi.ResourceOptions(parent=self, depends_on=node_grants),
            )
            for pool_name, pool in args.node_pools.items()
        ]
        # The identity pool of Workload Identity exists once the cluster that enables it does: bindings
        # to its members that take the pool from here wait for the cluster.
        self.workload_pool: pulumi.Output[str] = cluster.workload_identity_config.workload_pool
        dns_endpoint = cluster.control_plane_endpoints_config.apply(
            lambda endpoints: endpoints.dns_endpoint_config.endpoint)
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(cluster.name, dns_endpoint).apply(
            lambda values: kubeconfig(*values)))
        self.provider = k8s.Provider(f"{name}-provider", kubeconfig=self.kubeconfig,
                                     opts=pulumi.ResourceOptions(parent=self, depends_on=self.node_pools))
        self.register_outputs({"kubeconfig": self.kubeconfig, "endpoint": dns_endpoint,
                               "nodeServiceAccount": node_account.email})

    def _node_service_account(self, name: str, args: GkeClusterArgs, child: pulumi.ResourceOptions,
                              ) -> tuple[gcp.serviceaccount.Account, list[pulumi.Resource]]:
        """The nodes' service account and its grants: GKE's node role on the project, and reading
        (only) the image repository."""
        account = gcp.serviceaccount.Account(
            f"{name}-node-service-account", project=args.project,
            account_id=f"{args.name}{NODE_ACCOUNT_SUFFIX}", display_name=f"GKE nodes of {args.name}",
            opts=child)
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        grants: list[pulumi.Resource] = [
            gcp.projects.IAMMember(f"{name}-node-{role.rpartition('.')[2]}", project=args.project,
                                   role=role, member=member, opts=child)
            for role in NODE_PROJECT_ROLES
        ]
        repository = args.image_repository
        grants.append(gcp.artifactregistry.RepositoryIamMember(
            f"{name}-node-image-reader", project=repository.project, location=repository.location,
            repository=repository.repository_id, role=IMAGE_READER_ROLE, member=member, opts=child))
        return account, grants
