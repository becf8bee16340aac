"""What each actor on the cluster does, checked against what the stacks declare, where its code does
not run in the control-plane tier (tests/cluster/, which runs the real API server, Trainer, JobSet,
Kueue, KServe, KEDA and Argo on the local stack's objects): GKE's pools, Gateway, Cloud Armor, GCS
FUSE and Workload Identity; k3s's Traefik and k3d's ports; Prometheus; and the order in which Pulumi
creates things. (The training pods' placement on GKE's pools, with their tolerations and GPUs, is the
tier's: tests/cluster/test_gke_placement.py.)
Every test runs on both stacks' rendered objects (under Pulumi mocks) where the actor exists on both.
"""

from __future__ import annotations

import ipaddress
import json
import re

import pulumi
import pytest
import stack_checks
import yaml
from conftest import REPO_ROOT
from stack_checks import (
    PUBLISHED_VERSION,
    closure,
    embedded,
    named,
    objects_of,
    rendered_stack,
    template_of,
    train_steps,
    training_pods,
)

from cluster_steps import inference_service as shape
from cluster_steps import release as rollout
from common import cluster_names
from common.cluster_target import IMAGE_USER
from engines import ENGINES, engine_of_job
from engines.trainjob import TRAINER_NAMESPACE
from infra import gke_endpoint, k3d
from infra.pipeline import workflow_pod_rules
from infra.platform import ca_injected_transform
from pipeline import argo
from pipeline.definition import Layout
from stacks import render
from stacks.config import parse_stack_config
from stacks.declared import Declared
from stacks.kinds import k3d as k3d_kind

PROJECT, REGION = "dist-ml-test-4821", "us-central1"
SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
GLOBAL_ADDRESS = "gcp:compute/globalAddress:GlobalAddress"
SECURITY_POLICY = "gcp:compute/securityPolicy:SecurityPolicy"
WORKLOAD_IDENTITY = "iam.gke.io/gcp-service-account"
# What the emissary executor needs in every workflow pod (Argo's docs/workflow-rbac.md, v3.4+).
EXECUTOR_NEEDS = {("argoproj.io", "workflowtaskresults", verb) for verb in ("create", "patch")}
# kubectl's verbs for a resource template's action; its success/failure conditions are polled with GET.
ACTION_VERBS = {"create": {"create"}, "apply": {"get", "create", "patch"}, "delete": {"delete"},
                "patch": {"get", "patch"}}
# Who creates the namespaces the platform's own manifests put objects in (k3s's kube-system comes with
# the cluster: only the local stack puts an object there, Traefik's HelmChartConfig).
NAMESPACE_CREATORS = {"kubeflow": "platform-training-operator", TRAINER_NAMESPACE: "platform-trainer",
                      "cert-manager": "platform-cert-manager", "kube-system": "cluster-cluster"}


def stack_values(stack: str, **sections: dict) -> dict[str, str]:
    values = stack_checks.stack_values(REPO_ROOT / f"Pulumi.{stack}.yaml", **sections)
    if stack == "gke":
        values.update({"gcp:project": PROJECT, "gcp:region": REGION})
    return values


@pytest.fixture(scope="module", params=["local", "gke"])
def stack(request) -> render.Rendered:
    return rendered_stack(request.param, stack_values(request.param))


@pytest.fixture(scope="module")
def gke() -> render.Rendered:
    return rendered_stack("gke", stack_values("gke"))


PUBLIC_DOMAIN = "models.example.com"
ALLOWED_RANGES = [f"198.51.100.{n}/32" for n in range(12)] + ["203.0.113.0/24"]  # two allow rules' worth


def public_gke_values() -> dict[str, str]:
    values = stack_values("gke")
    cluster = json.loads(values["dist-ml:cluster"])
    cluster["endpoint"] = {"public": True, "domain": PUBLIC_DOMAIN, "allowedSourceRanges": ALLOWED_RANGES}
    return {**values, "dist-ml:cluster": json.dumps(cluster)}


@pytest.fixture(scope="module")
def public_gke() -> render.Rendered:
    """The gke stack with a public endpoint."""
    return rendered_stack("gke", public_gke_values())


@pytest.fixture(scope="module")
def local() -> render.Rendered:
    return rendered_stack("local", stack_values("local"))


def grants(rendered: render.Rendered, namespace: str, account_namespace: str, account: str) -> set[tuple]:
    """(group, resource, verb) that Roles bound to the account allow in `namespace`."""
    allowed = set()
    for binding in objects_of(rendered, "RoleBinding"):
        subjects = {(s["namespace"], s["name"]) for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if binding["metadata"]["namespace"] != namespace or (account_namespace, account) not in subjects:
            continue
        role = named(rendered, "Role", binding["roleRef"]["name"], namespace)
        for rule in role["rules"]:
            allowed |= {(group, resource, verb) for group in rule["apiGroups"]
                        for resource in rule["resources"] for verb in rule["verbs"]}
    return allowed


def bound_accounts(rendered: render.Rendered) -> set[tuple[str, str]]:
    return {(s["namespace"], s["name"]) for kind in ("RoleBinding", "ClusterRoleBinding")
            for binding in objects_of(rendered, kind) for s in binding["subjects"]}


def plural(kind: str) -> str:
    return kind.lower() + "s"


def workflow_pod_needs(template: dict) -> set[tuple]:
    """What the workflow's pods call, derived from the templates they run."""
    needs = set(EXECUTOR_NEEDS)
    for step in template["spec"]["templates"]:
        if "resource" in step:
            manifest = yaml.safe_load(step["resource"]["manifest"])
            group = manifest["apiVersion"].rpartition("/")[0]
            verbs = set(ACTION_VERBS[step["resource"]["action"]])
            if step["resource"].get("successCondition") or step["resource"].get("failureCondition"):
                verbs.add("get")
            needs |= {(group, plural(manifest["kind"]), verb) for verb in verbs}
        elif step.get("container", {}).get("command", [])[-1:] == [cluster_names.RELEASE_MODULE]:
            needs |= set(cluster_names.API_CALLS)
        elif step.get("container", {}).get("command", [])[-1:] == [cluster_names.TRAIN_STEP_MODULE]:
            needs |= set(engine_of_job(embedded(template, step["name"])["kind"]).step_calls)
    return needs


def test_argo_controller_reads_and_writes_the_memo_cache_in_its_own_namespace(stack):
    (ingest,) = [t for t in template_of(stack)["spec"]["templates"] if "memoize" in t]
    cache_name = ingest["memoize"]["cache"]["configMap"]["name"]
    cache = named(stack, "ConfigMap", cache_name)
    assert cache["metadata"]["namespace"] == argo.ARGO_NAMESPACE
    assert cache["metadata"]["labels"][argo.MEMO_CACHE_LABEL] == "Cache"  # Argo refuses it otherwise
    controller = grants(stack, argo.ARGO_NAMESPACE, argo.ARGO_NAMESPACE, argo.ARGO_CONTROLLER_ACCOUNT)
    assert {("", "configmaps", verb) for verb in ("get", "create", "update")} <= controller
    role = named(stack, "Role", cache_name, argo.ARGO_NAMESPACE)
    for rule in role["rules"]:  # only the cache, where a name can be given
        assert rule.get("resourceNames", [cache_name]) == [cache_name] or rule["verbs"] == ["create"]


def test_the_workflow_pods_hold_exactly_what_their_templates_do(stack):
    template = template_of(stack)
    namespace = template["metadata"]["namespace"]
    account = template["spec"]["serviceAccountName"]
    assert named(stack, "ServiceAccount", account, namespace)
    assert grants(stack, namespace, namespace, account) == workflow_pod_needs(template)
    assert not any(rule["resources"] == ["configmaps"] for engine in ENGINES.values()
                   for rule in workflow_pod_rules(engine))


def test_training_pods_the_predictor_and_the_logger_have_their_own_accounts_with_no_rights(stack):
    template = template_of(stack)
    namespace = template["metadata"]["namespace"]
    trainer = training_pods(stack, "train-cnn")[0]["spec"]
    predictor = embedded(template, "serve")["spec"]["predictor"]
    logger = named(stack, "Deployment", "dist-ml-logger", namespace)["spec"]["template"]["spec"]
    accounts = [trainer["serviceAccountName"], predictor["serviceAccountName"], logger["serviceAccountName"]]
    assert len(set(accounts)) == 3 and template["spec"]["serviceAccountName"] not in accounts
    for account in accounts:
        assert named(stack, "ServiceAccount", account, namespace)
        assert (namespace, account) not in bound_accounts(stack)


def test_every_pod_that_uses_the_bucket_has_a_google_identity_bound_to_its_account(gke):
    template = template_of(gke)
    namespace = template["metadata"]["namespace"]
    training_pod = training_pods(gke, "train-cnn")[0]
    logger_pod = named(gke, "Deployment", "dist-ml-logger", namespace)["spec"]["template"]
    users = {  # account -> the pod metadata of pods that mount the bucket (the predictor copies it)
        template["spec"]["serviceAccountName"]: template["spec"]["podMetadata"],
        training_pod["spec"]["serviceAccountName"]: training_pod["metadata"],
        logger_pod["spec"]["serviceAccountName"]: logger_pod["metadata"],
        embedded(template, "serve")["spec"]["predictor"]["serviceAccountName"]: None,
    }
    members = {r.inputs["member"] for r in gke.of_type("gcp:serviceaccount/iAMMember:IAMMember")
               if r.inputs["role"] == "roles/iam.workloadIdentityUser"}
    for account, pod_metadata in users.items():
        annotations = named(gke, "ServiceAccount", account, namespace)["metadata"].get("annotations", {})
        assert annotations.get(WORKLOAD_IDENTITY, "").endswith(f"@{PROJECT}.iam.gserviceaccount.com"), account
        assert any(member.endswith(f".svc.id.goog[{namespace}/{account}]") for member in members), account
        if pod_metadata is not None:  # the GCS FUSE CSI driver injects its sidecar only when asked
            assert pod_metadata["annotations"]["gke-gcsfuse/volumes"] == "true", account


def dockerfile_user(path: str) -> int:
    (user,) = re.findall(r"^USER\s+(\d+)\s*$", (REPO_ROOT / path).read_text(), flags=re.MULTILINE)
    return int(user)


def test_the_bucket_is_mounted_writable_for_the_images_user(gke):
    """GCS FUSE mounts as root with 0755 unless told otherwise; the images run as a non-root user."""
    assert dockerfile_user("trainer/Dockerfile") == dockerfile_user("serving/Dockerfile") == IMAGE_USER
    (volume,) = template_of(gke)["spec"]["volumes"]
    options = dict(option.partition("=")[::2]
                   for option in volume["csi"]["volumeAttributes"]["mountOptions"].split(","))
    assert options["uid"] == options["gid"] == str(IMAGE_USER)
    assert int(options["file-mode"], 8) & 0o600 == 0o600 and int(options["dir-mode"], 8) & 0o700 == 0o700


def test_the_predictor_serves_one_release_and_names_the_port_prometheus_scrapes(stack):
    template = template_of(stack)
    (volume,) = template["spec"]["volumes"]
    root = (f"pvc://{volume['persistentVolumeClaim']['claimName']}" if "persistentVolumeClaim" in volume
            else f"gs://{volume['csi']['volumeAttributes']['bucketName']}")
    predictor = embedded(template, "serve")["spec"]["predictor"]
    (container,) = predictor["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    # Only the run's version: KServe copies (gs) or mounts (pvc) everything under the URI.
    assert env["STORAGE_URI"] == f"{Layout(root).releases}/fmnist/{PUBLISHED_VERSION}"
    assert container["args"][:2] == ["--model-base-path", "/mnt/models"]
    for monitor in objects_of(stack, "PodMonitor"):
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in {port["name"] for port in container["ports"]}


def test_the_workflow_owns_the_inference_service_and_rolls_out_the_version_select_published(stack):
    assert objects_of(stack, "InferenceService") == []  # Pulumi declares none: one owner
    tasks = {t["name"]: t for t in template_of(stack)["spec"]["templates"][0]["dag"]["tasks"]}
    assert "select" in tasks["serve"]["depends"]
    assert stack.outputs["inferenceService"] == "dist-ml/fmnist"


def test_the_route_the_rollout_creates_attaches_to_the_stacks_gateway_and_reaches_kserves_services(stack):
    """The workflow's HTTPRoute (cluster_steps.release) names the Gateway the stack declares, in the same
    namespace, which admits routes of that namespace; its backends are the Services KServe creates for
    the InferenceServices the serve step deploys (Standard mode: <isvc>-predictor, port 80)."""
    template = template_of(stack)
    namespace = template["metadata"]["namespace"]
    (gateway,) = objects_of(stack, "Gateway")
    assert gateway["metadata"]["namespace"] == namespace
    (listener,) = gateway["spec"]["listeners"]  # inside a network: the model's listener alone, on HTTP
    assert listener["protocol"] == "HTTP" and listener["allowedRoutes"]["namespaces"]["from"] == "Same"
    isvc = embedded(template, "serve")
    route = rollout.http_route(isvc["metadata"]["name"], 10)
    gateway_name = gateway["metadata"]["name"]
    assert route["spec"]["parentRefs"] == [{"name": gateway_name, "sectionName": listener["name"]}]
    assert "namespace" not in route["spec"]["parentRefs"][0]  # the route's own, where the workflow runs
    backends = route["spec"]["rules"][0]["backendRefs"]
    assert [b["name"] for b in backends] == [f"{name}-predictor" for name in (
        isvc["metadata"]["name"], cluster_names.canary_name(isvc["metadata"]["name"]))]
    assert {b["port"] for b in backends} == {80}
    # Evidence comes from the predictor container's port, where the server serves /metrics.
    (container,) = isvc["spec"]["predictor"]["containers"]
    assert shape.metrics_port(isvc) == container["ports"][0]["containerPort"]
    # The Gateway is created only once the cluster serves its CRDs.
    assert "gateway-crds-ready" in closure(stack, "gateway-gateway")


def test_users_reach_the_model_through_the_gateway_never_one_predictor(stack):
    outputs = " ".join(str(value) for value in stack.outputs.values())
    assert "-predictor" not in outputs and "port-forward service/fmnist" not in outputs
    assert stack.outputs["inferenceRoute"] == f"dist-ml/{cluster_names.route_name('fmnist')}"
    assert stack.outputs["inferenceUrl"].endswith("/v1/models/fmnist:predict")


def test_k3s_traefik_serves_the_gateway_on_the_port_k3d_forwards(local):
    (config,) = objects_of(local, "HelmChartConfig")
    # It customizes k3s's own HelmChart of Traefik only under the same name and namespace.
    assert (config["metadata"]["name"], config["metadata"]["namespace"]) == ("traefik", "kube-system")
    values = yaml.safe_load(config["spec"]["valuesContent"])
    assert values["providers"]["kubernetesGateway"]["enabled"] is True
    # The chart creates GatewayClass `traefik` with the provider; its own Gateway is not wanted.
    assert values["gateway"]["enabled"] is False
    (gateway,) = objects_of(local, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == k3d.TRAEFIK_GATEWAY_CLASS == "traefik"
    # A listener must use an entry point's port (the chart's `web`, 8000, exposed on 80).
    assert gateway["spec"]["listeners"][0]["port"] == k3d.TRAEFIK_WEB_PORT == 8000
    (cluster,) = [r for r in local.of_type("command:local:Command") if r.name == "cluster-cluster"]
    # Bound to loopback: the model is published to this machine only, not to its network.
    assert "--port=127.0.0.1:8088:80@loadbalancer" in cluster.inputs["create"]
    assert local.outputs["inferenceUrl"] == "http://localhost:8088/v1/models/fmnist:predict"
    assert "traefik-gateway-provider" in closure(local, "gateway-crds-ready")


def test_the_k3d_host_port_binds_loopback_unless_the_stack_names_another_address():
    """Docker publishes a port without a host address on every interface of the machine: the
    default mapping names loopback, and the URL a user is given names the address bound."""
    ports = parse_stack_config({"cluster": {"kind": "k3d"}}).cluster.ports
    assert [(p.host_address, p.host, p.container) for p in ports] == [("127.0.0.1", 8088, 80)]
    args = k3d.K3dClusterArgs(name="n", servers=1, agents=0, k3s_image="rancher/k3s:v1.35.8-k3s1",
                              ports=(("0.0.0.0", 8088, 80), ("192.0.2.7", 8443, 443)))
    command = k3d.create_command(args)
    assert "--port=0.0.0.0:8088:80@loadbalancer --port=192.0.2.7:8443:443@loadbalancer" in command
    assert [k3d_kind.host_name(a) for a in ("127.0.0.1", "0.0.0.0", "192.0.2.7")] == [
        "localhost", "localhost", "192.0.2.7"]


def the(rendered: render.Rendered, type_token: str) -> Declared:
    (found,) = rendered.of_type(type_token)
    return found


def subnets(rendered: render.Rendered) -> dict[str, Declared]:
    return {r.name: r for r in rendered.of_type(SUBNETWORK)}


def test_by_default_gkes_gateway_is_an_internal_load_balancer_in_the_stacks_own_network(gke):
    """GKE's Gateway controller serves gke-l7-rilb only for a VPC-native cluster with HTTP load
    balancing, in a network that has an ACTIVE proxy-only subnet (at least a /26) in the cluster's
    region, made before the Gateway: the load balancer's proxies run there."""
    cluster = the(gke, "gcp:container/cluster:Cluster")
    network = the(gke, "gcp:compute/network:Network")
    assert cluster.inputs["gatewayApiConfig"] == {"channel": "CHANNEL_STANDARD"}
    assert cluster.inputs["addonsConfig"]["httpLoadBalancing"] == {"disabled": False}
    assert cluster.inputs["networkingMode"] == "VPC_NATIVE"
    assert network.inputs["autoCreateSubnetworks"] is False  # every range is declared
    nodes, proxy_only = subnets(gke)["network-nodes"], subnets(gke)["network-proxy-only"]
    assert cluster.inputs["network"] == f"{network.name}-id"
    assert cluster.inputs["subnetwork"] == f"{nodes.name}-id"
    secondary = {r["rangeName"]: r["ipCidrRange"] for r in nodes.inputs["secondaryIpRanges"]}
    assert cluster.inputs["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "pods",
                                                    "servicesSecondaryRangeName": "services"}
    assert set(secondary) == {"pods", "services"}
    assert (proxy_only.inputs["purpose"], proxy_only.inputs["role"]) == ("REGIONAL_MANAGED_PROXY", "ACTIVE")
    assert proxy_only.inputs["network"] == f"{network.name}-id"
    assert proxy_only.inputs["region"] == nodes.inputs["region"] == cluster.inputs["location"] == REGION
    assert ipaddress.ip_network(proxy_only.inputs["ipCidrRange"]).prefixlen <= 26
    (peering,) = [r for r in gke.of_type(GLOBAL_ADDRESS) if r.inputs["purpose"] == "VPC_PEERING"]
    peering_range = f"{peering.inputs['address']}/{peering.inputs['prefixLength']}"
    ranges = [ipaddress.ip_network(r) for r in (nodes.inputs["ipCidrRange"], *secondary.values(),
                                                 proxy_only.inputs["ipCidrRange"], peering_range)]
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1:])
    (gateway,) = objects_of(gke, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == gke_endpoint.INTERNAL_GATEWAY_CLASS == "gke-l7-rilb"
    assert [(lis["protocol"], lis["port"]) for lis in gateway["spec"]["listeners"]] == [("HTTP", 80)]
    assert "network-proxy-only" in closure(gke, "gateway-gateway")
    # Nothing of a public endpoint: no address, certificate, allowlist or backend policy (the one
    # global address is the tracking database's private services range).
    assert not [r for r in gke.resources if r.type.startswith("gcp:certificatemanager/")
                or r.type == SECURITY_POLICY or (r.type == GLOBAL_ADDRESS and r is not peering)]
    assert objects_of(gke, "GCPBackendPolicy") == []
    assert "get gateway dist-ml" in gke.outputs["inferenceAddress"]
    assert gke.outputs["inferenceUrl"] == "http://<inferenceAddress>/v1/models/fmnist:predict"
    # From inside: a pod of the cluster is in the network and region; it calls the Gateway's address.
    assert "kubectl -n dist-ml run" in gke.outputs["inferenceFromInside"]
    assert "curl -sS http://$(kubectl -n dist-ml get gateway dist-ml" in gke.outputs["inferenceFromInside"]
    assert f"VPC network dist-ml, region {REGION}" in gke.outputs["inferenceNetwork"]


def test_a_zonal_cluster_gets_its_subnets_in_the_zones_region():
    values = stack_values("gke")
    cluster = {**json.loads(values["dist-ml:cluster"]), "location": "europe-west4-b"}
    rendered = rendered_stack("gke", {**values, "dist-ml:cluster": json.dumps(cluster)})
    assert {s.inputs["region"] for s in subnets(rendered).values()} == {"europe-west4"}


def test_a_public_gke_endpoint_serves_https_for_its_domain_and_redirects_plain_http(public_gke):
    """The global external class takes its certificate from the Certificate Manager map the Gateway's
    annotation names (no tls block then), and its address from the reserved one it names. The
    model's route attaches to the HTTPS listener alone; the HTTP listener's one route redirects."""
    (gateway,) = objects_of(public_gke, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == gke_endpoint.PUBLIC_GATEWAY_CLASS
    certificate_map = the(public_gke, "gcp:certificatemanager/certificateMap:CertificateMap")
    (address,) = [r for r in public_gke.of_type(GLOBAL_ADDRESS) if r.inputs.get("purpose") != "VPC_PEERING"]
    assert gateway["metadata"]["annotations"] == {"networking.gke.io/certmap": certificate_map.inputs["name"]}
    assert gateway["spec"]["addresses"] == [{"type": "NamedAddress", "value": address.inputs["name"]}]
    listeners = {lis["name"]: lis for lis in gateway["spec"]["listeners"]}
    model = listeners[cluster_names.MODEL_LISTENER]
    assert (model["protocol"], model["port"]) == ("HTTPS", 443) and "tls" not in model
    (plain,) = [lis for lis in listeners.values() if lis["protocol"] == "HTTP"]
    assert plain["port"] == 80
    isvc = embedded(template_of(public_gke), "serve")
    model_route = rollout.http_route(isvc["metadata"]["name"], 10)
    assert {ref["sectionName"] for ref in model_route["spec"]["parentRefs"]} == {model["name"]}
    (redirect,) = objects_of(public_gke, "HTTPRoute")
    gateway_name = gateway["metadata"]["name"]
    assert redirect["spec"]["parentRefs"] == [{"name": gateway_name, "sectionName": plain["name"]}]
    assert redirect["spec"]["rules"] == [{"filters": [{"type": "RequestRedirect", "requestRedirect": {
        "scheme": "https", "statusCode": 301}}]}]  # no backendRefs: nothing reaches the model on HTTP
    # The certificate: Google-managed for the domain, proven by a DNS authorization, in the map.
    authorization = the(public_gke, "gcp:certificatemanager/dnsAuthorization:DnsAuthorization")
    certificate = the(public_gke, "gcp:certificatemanager/certificate:Certificate")
    entry = the(public_gke, "gcp:certificatemanager/certificateMapEntry:CertificateMapEntry")
    assert authorization.inputs["domain"] == PUBLIC_DOMAIN
    assert certificate.inputs["managed"] == {"domains": [PUBLIC_DOMAIN],
                                             "dnsAuthorizations": [f"{authorization.name}-id"]}
    assert certificate.inputs["scope"] == "DEFAULT"  # what global external load balancers serve
    assert (entry.inputs["map"], entry.inputs["hostname"]) == (certificate_map.inputs["name"], PUBLIC_DOMAIN)
    assert entry.inputs["certificates"] == [f"{certificate.name}-id"]
    # The Gateway is made once what it names exists; no proxy-only subnet (a global class).
    assert {address.name, entry.name} <= closure(public_gke, "gateway-gateway")
    assert "network-proxy-only" not in subnets(public_gke)
    # Users: the https URL, and the DNS records to publish (A to the address, the authorization's CNAME).
    assert public_gke.outputs["inferenceUrl"] == f"https://{PUBLIC_DOMAIN}/v1/models/fmnist:predict"
    records = {(r["type"], r["name"]): r["data"] for r in public_gke.outputs["dnsRecords"]}
    assert records[("A", f"{PUBLIC_DOMAIN}.")] == public_gke.outputs["publicAddress"]
    assert ("CNAME", f"_acme-challenge.{PUBLIC_DOMAIN}.") in records


def test_every_backend_of_a_public_endpoint_is_behind_an_allowlist_that_denies_the_rest(public_gke):
    """GKE programs each backend service from the GCPBackendPolicy targeting its Service, in the
    Service's namespace; a Service without one is served with no Cloud Armor policy. So every Service
    the model's route can name, the canary's too, has one, made before the Gateway, naming the
    allowlist, whose rules let the configured ranges in (10 a rule at most) and deny the rest."""
    isvc = embedded(template_of(public_gke), "serve")
    namespace = template_of(public_gke)["metadata"]["namespace"]
    (rule,) = rollout.http_route(isvc["metadata"]["name"], 10)["spec"]["rules"]
    backends = {backend["name"] for backend in rule["backendRefs"]}
    armor = the(public_gke, SECURITY_POLICY)
    policies = objects_of(public_gke, "GCPBackendPolicy")
    assert {p["spec"]["targetRef"]["name"] for p in policies} == backends == {
        "fmnist-predictor", "fmnist-canary-predictor"}
    for policy in policies:
        assert policy["metadata"]["namespace"] == namespace
        assert policy["spec"]["targetRef"] == {"group": "", "kind": "Service",
                                               "name": policy["spec"]["targetRef"]["name"]}
        assert policy["spec"]["default"] == {"securityPolicy": armor.inputs["name"]}
    assert {f"gateway-gcpbackendpolicy-{name}" for name in backends} <= closure(public_gke, "gateway-gateway")
    assert "gcpbackendpolicies.networking.gke.io" in the_command(public_gke, "gateway-crds-ready")
    assert armor.inputs["type"] == "CLOUD_ARMOR"
    rules = sorted(armor.inputs["rules"], key=lambda rule: rule["priority"])
    *allow, default = rules
    assert default["priority"] == 2147483647 and default["action"] == "deny(403)"
    assert default["match"]["config"]["srcIpRanges"] == ["*"]
    assert all(r["action"] == "allow" and len(r["match"]["config"]["srcIpRanges"]) <= 10 for r in allow)
    assert [r for rule in allow for r in rule["match"]["config"]["srcIpRanges"]] == ALLOWED_RANGES


def the_command(rendered: render.Rendered, name: str) -> str:
    (command,) = [r for r in rendered.of_type("command:local:Command") if r.name == name]
    return command.inputs["create"]


def test_every_gateway_keeps_the_gateway_apis_listener_rules(stack, public_gke):
    """The Gateway CRD's CEL rules (testdata/upstream/gateway-api-v1.2.1, not evaluated by the schema
    validator): no tls on HTTP, HTTPS with tls terminates, names unique, port+protocol+hostname unique."""
    for rendered in (stack, public_gke):
        for gateway in objects_of(rendered, "Gateway"):
            listeners = gateway["spec"]["listeners"]
            assert all("tls" not in lis for lis in listeners if lis["protocol"] in ("HTTP", "TCP", "UDP"))
            assert all(lis["tls"].get("mode", "Terminate") == "Terminate" for lis in listeners
                       if lis["protocol"] == "HTTPS" and "tls" in lis)
            assert len({lis["name"] for lis in listeners}) == len(listeners)
            assert len({(lis["port"], lis["protocol"], lis.get("hostname"))
                        for lis in listeners}) == len(listeners)


def test_monitors_name_ports_that_exist(gke):
    """Kueue's metrics Service names its port `https` and serves /metrics over TLS to a token allowed
    to GET it (kueue v0.19.2 charts/kueue: metricsService, prometheus/monitor.yaml)."""
    (queue,) = objects_of(gke, "ServiceMonitor")
    assert queue["metadata"]["namespace"] == "kueue-system"
    assert queue["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "kueue",
                                                        "app.kubernetes.io/component": "metrics-service"}
    (endpoint,) = queue["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("https", "https", "/metrics")
    assert endpoint["bearerTokenFile"].endswith("serviceaccount/token")
    assert "targetPort" not in json.dumps([o["spec"] for o in objects_of(gke, "PodMonitor")])


def test_with_the_tfjob_engine_the_training_operators_service_is_monitored():
    rendered = rendered_stack("gke", stack_values_with_engine("gke", "tfjob"))
    (operator,) = objects_of(rendered, "ServiceMonitor")
    assert operator["metadata"]["namespace"] == "kubeflow"
    # kubeflow/trainer v1.9.4's Service names its port 8080; the container port has no name.
    assert operator["spec"]["selector"]["matchLabels"] == {"app": "training-operator"}
    assert operator["spec"]["endpoints"] == [{"port": "monitoring-port", "path": "/metrics"}]


def stack_values_with_engine(stack: str, engine: str) -> dict[str, str]:
    """The stack file's values with another engine (and its platform keys)."""
    values = stack_values(stack, pipeline={"engine": engine})
    platform = {key: value for key, value in json.loads(values["dist-ml:platform"]).items()
                if key not in ("trainerVersion", "kueueVersion")}
    values["dist-ml:platform"] = json.dumps(platform)
    if stack == "local":
        values["dist-ml:cluster"] = json.dumps({key: value for key, value in json.loads(
            values["dist-ml:cluster"]).items() if key != "trainingQuota"})
    return values


def test_with_tf_serving_the_predictor_has_no_monitor_for_metrics_it_does_not_serve():
    values = stack_values("gke")
    values["dist-ml:serving"] = json.dumps({**json.loads(values["dist-ml:serving"]), "runtime": "tensorflow",
                                            "autoscaling": {"metric": "cpu"}})
    values["dist-ml:pipeline"] = json.dumps({**json.loads(values["dist-ml:pipeline"]),
                                             "rollout": {"canaryPercent": 0}})
    assert objects_of(rendered_stack("gke", values), "PodMonitor") == []


def test_kueue_is_installed_after_trainers_crds_and_controllers(stack):
    """Kueue's TrainJob integration reads Trainer's runtimes when Kueue starts; started first, its
    webhook refused every TrainJob ("unsupported runtime: ClusterTrainingRuntime...") in a tier run
    where Pulumi happened to start Kueue's pod before Trainer's install was done."""
    assert "platform-trainer" in closure(stack, "platform-kueue")


def test_every_namespaced_object_waits_for_its_namespace(stack):
    creators = {**NAMESPACE_CREATORS, **{r.inputs["metadata"]["name"]: r.name for r in stack.resources
                                         if r.type == "kubernetes:core/v1:Namespace"}}
    for resource in stack.resources:
        namespace = resource.is_kubernetes_object and resource.inputs["metadata"].get("namespace")
        if namespace:
            assert creators[namespace] in closure(stack, resource.name), (resource.name, namespace)


def test_destroy_deletes_the_systems_namespace_before_the_platform_and_what_is_in_it_with_it(stack):
    """What the workflow makes in the system's namespace (InferenceServices, TrainJobs, Workflows) carries
    finalizers the platform's controllers remove, and its pods mount the stack's claims: `pulumi destroy`
    deletes the namespace while the controllers run, and lets the namespace controller delete what is in
    it, pods first (one by one, a claim in use would wait for ever). tests/e2e_node destroys for real."""
    system_namespace = stack_checks.workflow_namespace(stack)
    (namespace,) = [r for r in stack.of_type("kubernetes:core/v1:Namespace")
                    if r.inputs["metadata"]["name"] == system_namespace]
    installs = {r.name for r in stack.resources if r.parent == "platform"}
    assert installs and installs <= closure(stack, namespace.name)
    for resource in stack.resources:
        if resource.is_kubernetes_object:
            inside = resource.inputs["metadata"].get("namespace") == system_namespace
            assert resource.deleted_with == (namespace.name if inside else ""), resource.name


def test_kserve_is_installed_only_once_cert_managers_webhook_has_its_ca(stack):
    """KServe's chart waits for cert-manager's, whose webhook configurations the provider awaits until
    cainjector has written their CA (`pulumi.com/waitFor`, set by a transform on the chart's objects:
    the real engine applies it; under mocks the chart's objects are not rendered, so it is called here).
    The control-plane tier does not run cert-manager (docs/development.md): this is the hand check."""
    assert "platform-cert-manager" in closure(stack, "platform-kserve-resources")
    assert not stack.of_type("command:local:Command") or all(
        "cert-manager" not in r.name for r in stack.of_type("command:local:Command"))
    webhook = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "cert-manager-webhook", "annotations": {"cert-manager.io/x": "y"}},
               "webhooks": [{"name": "webhook.cert-manager.io", "clientConfig": {"service": {}}}]}
    transformed = ca_injected_transform(pulumi.ResourceTransformArgs(
        True, "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration", "w", webhook,
        pulumi.ResourceOptions()))
    assert transformed.props["metadata"]["annotations"] == {
        "cert-manager.io/x": "y", "pulumi.com/waitFor": "jsonpath={.webhooks[0].clientConfig.caBundle}"}
    other = {**webhook, "metadata": {"name": "kserve-webhook"}}
    assert ca_injected_transform(pulumi.ResourceTransformArgs(
        True, "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration", "w", other,
        pulumi.ResourceOptions())) is None


def test_a_changed_k3d_cluster_is_deleted_before_its_namesake_is_created(local):
    (cluster,) = [r for r in local.of_type("command:local:Command") if r.name == "cluster-cluster"]
    assert cluster.inputs["create"].startswith("k3d cluster create dist-ml ")
    assert cluster.delete_before_replace


def test_images_are_imported_into_every_new_k3d_cluster(local):
    cluster_id = "cluster-cluster-id"  # what the mocks answer for the cluster command's id
    imports = [r for r in local.of_type("command:local:Command") if "k3d image import" in r.inputs["create"]]
    assert len(imports) == 3 and all(cluster_id in r.inputs["triggers"] for r in imports)


def quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi)?", value)
    return float(match[1]) * units.get(match[2] or "", 1)


def pod_requests(pod: dict) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in pod["spec"]["containers"]:
        for resource, amount in container.get("resources", {}).get("requests", {}).items():
            total[resource] = total.get(resource, 0) + quantity(str(amount))
    return total


def test_the_local_stacks_defaults_fit_a_default_k3d_cluster(local):
    """The busiest moments of a run on the default local config, each within 3 CPUs and 6 GiB, leaving
    a 4-CPU, 8-GiB Docker VM room for the platform: training (every train step's pod watching its
    TrainJob, what Kueue's quota admits of them, the stable predictor and the logger), and the
    rollout (the stable predictor rolling to the promoted version and the canary, each with one surge
    replica, and the logger)."""
    template = template_of(local)
    assert "parallelism" not in template["spec"]  # every variant's TrainJob is submitted at once
    steps = [t for t in template["spec"]["templates"] if t["name"].startswith("train-")]
    (queue,) = objects_of(local, "ClusterQueue")
    quota = {r["name"]: quantity(r["nominalQuota"])
             for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    predictor = embedded(template, "serve")["spec"]["predictor"]
    replica = predictor["containers"][0]["resources"]["requests"]
    logger = named(local, "Deployment", "dist-ml-logger")["spec"]["template"]["spec"]["containers"][0]
    serving = [replica] * predictor["minReplicas"] + [logger["resources"]["requests"]]
    watchers = [step["container"]["resources"]["requests"] for step in steps]
    rolling = [replica] * (predictor["minReplicas"] + 1) * 2 + [logger["resources"]["requests"]]
    for pods, admitted in ((serving + watchers, quota), (rolling, {})):
        assert sum(quantity(p["cpu"]) for p in pods) + admitted.get("cpu", 0) <= 3
        assert sum(quantity(p["memory"]) for p in pods) + admitted.get("memory", 0) <= 6 * 2**30


def test_every_trainjob_fits_its_queue_or_kueue_would_never_admit_it(stack):
    """Kueue admits a job only when the quota holds all of its pods' requests at once."""
    (queue,) = objects_of(stack, "ClusterQueue")
    quota = {r["name"]: quantity(r["nominalQuota"])
             for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    for step in train_steps(stack):
        needs: dict[str, float] = {}
        for pod in training_pods(stack, step):
            for resource, amount in pod_requests(pod).items():
                needs[resource] = needs.get(resource, 0) + amount
        assert set(needs) <= set(queue["spec"]["resourceGroups"][0]["coveredResources"]), step
        assert all(amount <= quota[resource] for resource, amount in needs.items()), (step, needs, quota)


# JobSet v0.12.0 pkg/webhooks/jobset_webhook.go ruleNameFmt. Its webhook refuses a JobSet whose failure
# policy names a rule otherwise (the control-plane tier runs that webhook; this is the fast check).
JOBSET_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@pytest.mark.parametrize("strategy", ["sync", "parameter-server"])
def test_every_failure_policy_rule_name_is_one_jobsets_webhook_accepts(strategy):
    rendered = rendered_stack("local", stack_values("local", pipeline={"variants": ["cnn"],
                                                                         "strategy": strategy}))
    (runtime,) = objects_of(rendered, "ClusterTrainingRuntime")
    rules = runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"]
    assert rules and all(JOBSET_RULE_NAME.fullmatch(rule["name"]) for rule in rules), rules


def test_trainer_and_kueue_are_installed_before_the_objects_their_webhooks_check(stack):
    for kind in ("ClusterTrainingRuntime", "WorkflowTemplate"):
        for resource in stack.resources:
            if resource.is_kubernetes_object and resource.inputs["kind"] == kind:
                assert {"platform-trainer", "platform-kueue"} <= closure(stack, resource.name), resource.name
    for kind in ("ResourceFlavor", "ClusterQueue", "LocalQueue"):
        (resource,) = [r for r in stack.resources if r.is_kubernetes_object and r.inputs["kind"] == kind]
        assert "platform-kueue" in closure(stack, resource.name)
    # The workflow's TrainJobs name a runtime that exists: Trainer's and Kueue's webhooks refuse others.
    assert any(r.inputs.get("kind") == "ClusterTrainingRuntime" for r in stack.resources
               if r.name in closure(stack, "pipeline-workflow-template"))


