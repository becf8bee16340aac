"""The GKE cluster's own VPC network, declared rather than the project's `default` one: a subnet for
the nodes with secondary ranges for pods and Services (a VPC-native cluster, which GKE's Gateway
controller requires), and, for an internal Gateway, the proxy-only subnet its load balancer runs in.

Why not `default`: a project may have none (an organization policy skips it), its firewall rules let
SSH and RDP in from anywhere, and the proxy-only subnet is one per region per network, which another
team's load balancer in `default` may already hold. In a network of its own the stack owns all three.

GKE's docs: "Gateway API is supported on VPC-native clusters only"; "if you are using the regional or
cross-region GatewayClasses, you must enable a proxy-only subnet" (kubernetes-engine/docs/how-to/
deploying-gateways and configure-gateway-resources). The proxy-only subnet is purpose
REGIONAL_MANAGED_PROXY, role ACTIVE, at least a /26, in the load balancer's region and network
(load-balancing/docs/proxy-only-subnets). GKE creates the firewall rules its cluster, its Gateways
and their health checks need (kubernetes-engine/docs/concepts/firewall-rules).

The nodes are private (no external address: infra/gke.py), so their way out is Cloud NAT on a Cloud
Router, for the nodes' subnet with its pods' range (images pulled from registries outside Google: the
upstream controllers'); Google's APIs stay on Private Google Access (nat/docs/overview; kubernetes-
engine/docs/how-to/latest/network-isolation). NAT answers only connections the nodes open: nothing
outside reaches in.

The control plane calls the platform's admission webhooks and aggregated APIs on their pods. GKE's own
rule for private nodes lets it in on tcp 443 and 10250 only (kubernetes-engine/docs/concepts/
firewall-rules, "private clusters": `gke-[cluster-name]-[cluster-hash]-master`), while Kueue's,
JobSet's, Trainer's, KServe's and KEDA's webhooks listen on 9443, Kueue's visibility API on 8082 and
KEDA's metrics API on 6443: without a rule of our own the first ResourceFlavor or InferenceService
times out inside the API server. Cloud Service Mesh documents the same rule (service-mesh/docs/
private-cluster-open-port). Its source is the control plane's range: the cluster's control-plane
endpoint is provisioned in a subnet of ours (`private_endpoint_subnetwork`, a Private Service Connect
cluster has no `master_ipv4_cidr_block`), so the range is one the stack declares and no wider; its
ports are exactly those the installs name (common/installs.py, control_plane_ports), its targets the
nodes' tag.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

# The network's ranges, disjoint; change them here if they overlap a network this one is peered with.
NODES_RANGE = "10.0.0.0/20"  # 4,096 node addresses
PODS_RANGE = "10.4.0.0/14"  # GKE's default size: up to 1,024 nodes of 110 pods
SERVICES_RANGE = "10.8.0.0/20"
PROXY_ONLY_RANGE = "10.9.0.0/23"  # Google recommends a /23; /26 is the least it takes
CONTROL_PLANE_RANGE = "10.9.2.0/28"  # the control plane's internal endpoint: a /28, as GKE's own ranges
PODS_RANGE_NAME, SERVICES_RANGE_NAME = "pods", "services"
PROXY_ONLY_PURPOSE, PROXY_ONLY_ROLE = "REGIONAL_MANAGED_PROXY", "ACTIVE"
# Cloud NAT: addresses Google allocates as the nodes need them, for every range of the nodes' subnet
# (the nodes' and the pods'), and a log of the translations that fail.
NAT_IP_ALLOCATION = "AUTO_ONLY"
NAT_SOURCE = "LIST_OF_SUBNETWORKS"
NAT_SUBNET_RANGES = ["ALL_IP_RANGES"]
NAT_LOG = {"enable": True, "filter": "ERRORS_ONLY"}
# Private services access: Google's services network (the tracking server's Cloud SQL instance) peers
# here; Google recommends a /16 (cloud.google.com/sql/docs/postgres/private-ip, allocated range size).
SERVICES_PEERING_ADDRESS, SERVICES_PEERING_PREFIX = "10.16.0.0", 16
SERVICES_PEERING_RANGE = f"{SERVICES_PEERING_ADDRESS}/{SERVICES_PEERING_PREFIX}"
NETWORK_RANGES = (NODES_RANGE, PODS_RANGE, SERVICES_RANGE, PROXY_ONLY_RANGE, CONTROL_PLANE_RANGE,
                  SERVICES_PEERING_RANGE)
WEBHOOKS_PROTOCOL = "tcp"


def node_tag(cluster: str) -> str:
    """The network tag of the cluster's nodes, which the webhook rule targets (GKE's own tag carries a
    hash nobody knows in advance)."""
    return f"{cluster}-nodes"


def region_of(location: str) -> str:
    """The region of a GKE location: a region (us-central1) or a zone (us-central1-a)."""
    parts = location.split("-")
    return "-".join(parts[:2])


@dataclasses.dataclass(frozen=True)
class GkeNetworkArgs:
    project: str
    name: str  # the network's; its subnets are <name>-nodes and <name>-proxy-only
    region: str  # the cluster's
    proxy_only_subnet: bool  # an internal (regional) Gateway's load balancer needs one
    cluster: str  # the GKE cluster's name: its nodes' tag
    control_plane_ports: tuple[int, ...]  # the webhooks' and aggregated APIs' ports on the nodes' pods


class GkeNetwork(pulumi.ComponentResource):
    network: gcp.compute.Network
    nodes: gcp.compute.Subnetwork
    proxy_only: gcp.compute.Subnetwork | None
    control_plane: gcp.compute.Subnetwork
    nat: gcp.compute.RouterNat

    def __init__(self, name: str, args: GkeNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:GkeNetwork", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.network = gcp.compute.Network(
            f"{name}-network", project=args.project, name=args.name,
            auto_create_subnetworks=False, routing_mode="REGIONAL", opts=child)
        self.nodes = gcp.compute.Subnetwork(
            f"{name}-nodes", project=args.project, name=f"{args.name}-nodes", region=args.region,
            network=self.network.id, ip_cidr_range=NODES_RANGE,
            secondary_ip_ranges=[{"range_name": PODS_RANGE_NAME, "ip_cidr_range": PODS_RANGE},
                                 {"range_name": SERVICES_RANGE_NAME, "ip_cidr_range": SERVICES_RANGE}],
            # Nodes reach Google's APIs (Artifact Registry, GCS) on internal routes.
            private_ip_google_access=True, opts=child)
        self.proxy_only = gcp.compute.Subnetwork(
            f"{name}-proxy-only", project=args.project, name=f"{args.name}-proxy-only", region=args.region,
            network=self.network.id, ip_cidr_range=PROXY_ONLY_RANGE, purpose=PROXY_ONLY_PURPOSE,
            role=PROXY_ONLY_ROLE, opts=child) if args.proxy_only_subnet else None
        self.control_plane = gcp.compute.Subnetwork(
            f"{name}-control-plane", project=args.project, name=f"{args.name}-control-plane",
            region=args.region, network=self.network.id, ip_cidr_range=CONTROL_PLANE_RANGE,
            private_ip_google_access=True, opts=child)
        if args.control_plane_ports:
            gcp.compute.Firewall(
                f"{name}-control-plane-to-webhooks", project=args.project,
                name=f"{args.name}-control-plane-to-webhooks", network=self.network.id,
                description="The control plane calls the platform's admission webhooks and aggregated APIs",
                direction="INGRESS", source_ranges=[CONTROL_PLANE_RANGE],
                target_tags=[node_tag(args.cluster)],
                allows=[{"protocol": WEBHOOKS_PROTOCOL,
                         "ports": [str(port) for port in args.control_plane_ports]}],
                opts=child)
        router = gcp.compute.Router(
            f"{name}-router", project=args.project, name=f"{args.name}-router", region=args.region,
            network=self.network.id, opts=child)
        self.nat = gcp.compute.RouterNat(
            f"{name}-nat", project=args.project, name=f"{args.name}-nat", region=args.region,
            router=router.name, nat_ip_allocate_option=NAT_IP_ALLOCATION,
            source_subnetwork_ip_ranges_to_nat=NAT_SOURCE,
            subnetworks=[{"name": self.nodes.id, "source_ip_ranges_to_nats": NAT_SUBNET_RANGES}],
            log_config=NAT_LOG, opts=child)
        self.register_outputs({"network": self.network.name, "nodes": self.nodes.name, "nat": self.nat.name})
