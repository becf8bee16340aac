"""Policies over the Kubernetes objects a stack declares, as plain functions of the rendered objects
(each returns its violations), which the policy pack (stacks/policy_pack.py) runs under `pulumi
preview` and `up`, and the tests over the render. A value Pulumi computes during `up` reads as
UNKNOWN in a preview (stacks/declared.py): a policy passes over it, and judges it on `up`.

Pods hide in many places: Deployments, TFJob replica templates, training runtimes' replicated jobs,
Argo container templates, the TrainJobs and TFJobs the train steps create (a TrainJob's `trainer` is its
node containers' image and resources), the InferenceService the serve step rolls out, predictors.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

import yaml

from common import pod_security
from common.cluster_names import MANIFEST_FLAG as ROLLOUT_MANIFEST_FLAG
from common.cluster_names import canary_name, predictor_deployment_name
from common.kubernetes_support import untested
from infra import gke_endpoint as gke
from stacks.declared import UNKNOWN

PRIVILEGED_ROLES = ("cluster-admin",)


def _walk(node: Any, where: str) -> Iterator[tuple[str, dict]]:
    """Every mapping under `node` with its path, descending into Argo's embedded manifests (resource
    templates' and the serve step's)."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            if key == "manifest" and isinstance(value, str):
                yield from _walk(yaml.safe_load(value), f"{where}.manifest")
            elif key == "args" and isinstance(value, list) and ROLLOUT_MANIFEST_FLAG in value:
                manifest = value[value.index(ROLLOUT_MANIFEST_FLAG) + 1]
                yield from _walk(json.loads(manifest), f"{where}.args.manifest")
            else:
                yield from _walk(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{where}[{index}]")


def name_of(manifest: dict) -> str:
    return f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"


def containers(manifest: dict) -> Iterator[tuple[str, dict]]:
    """(path, container) for every container, for KServe's built-in predictor `model`, and for a
    TrainJob's `trainer` (its image and resourcesPerNode go into its runtime's node containers)."""
    for where, node in _walk(manifest, name_of(manifest)):
        for key in ("containers", "initContainers"):
            for index, container in enumerate(node.get(key) or []):
                yield f"{where}.{key}[{index}]", container
        if isinstance(node.get("trainer"), dict) and "image" in node["trainer"]:
            trainer = node["trainer"]
            yield f"{where}.trainer", {"image": trainer["image"],
                                       "resources": trainer.get("resourcesPerNode")}
        if isinstance(node.get("container"), dict):
            yield f"{where}.container", node["container"]
        if isinstance(node.get("model"), dict) and "modelFormat" in node["model"]:
            yield f"{where}.model", node["model"]


def pods(manifest: dict) -> Iterator[tuple[str, dict, dict[str, dict]]]:
    """(path, pod-level fields, containers by path) for every pod a manifest describes: a pod spec
    (Deployments, jobs' templates, a predictor, whose `model` is a container), and an Argo workflow's
    spec, whose templates' containers its step pods run. A TrainJob's runtimePatches are not pods:
    they patch a runtime's, which is judged whole."""
    for where, node in _walk(manifest, name_of(manifest)):
        if ".runtimePatches" in where:
            continue
        found = {f"{where}.{key}[{index}]": container for key in ("containers", "initContainers")
                 for index, container in enumerate(node.get(key) or [])}
        if isinstance(node.get("model"), dict) and "modelFormat" in node["model"]:
            found[f"{where}.model"] = node["model"]
        if isinstance(node.get("templates"), list):
            found.update({f"{where}.templates[{index}].container": template["container"]
                          for index, template in enumerate(node["templates"])
                          if isinstance(template, dict) and isinstance(template.get("container"), dict)})
        if found:
            yield where, node, found


def restricted_pods(objects: Sequence[dict]) -> list[str]:
    """Every pod meets the `restricted` Pod Security Standard as common.pod_security says; one whose
    security contexts Pulumi computes during `up` is judged then."""
    violations = []
    for manifest in objects:
        for where, pod, found in pods(manifest):
            contexts = [pod.get("securityContext"), *(c.get("securityContext") for c in found.values())]
            if any(context is UNKNOWN for context in contexts):
                continue
            violations.extend(f"{where}: {why}" for why in pod_security.violations(pod, found))
    return violations


def no_cluster_admin(objects: Sequence[dict]) -> list[str]:
    return [f"{name_of(o)} binds {o['roleRef']['name']}" for o in objects
            if o.get("kind") in ("RoleBinding", "ClusterRoleBinding")
            and o.get("roleRef", {}).get("name") in PRIVILEGED_ROLES]


def requests_and_limits(objects: Sequence[dict]) -> list[str]:
    violations = []
    for manifest in objects:
        for where, container in containers(manifest):
            resources = container.get("resources") or {}
            if resources is UNKNOWN:
                continue
            for kind in ("requests", "limits"):
                missing = [r for r in ("cpu", "memory") if r not in (resources.get(kind) or {})]
                if missing:
                    violations.append(f"{where}: no {kind} for {', '.join(missing)}")
    return violations


def pinned_images(objects: Sequence[dict]) -> list[str]:
    violations = []
    for manifest in objects:
        for where, container in containers(manifest):
            image = container.get("image")
            if image is None or image is UNKNOWN:
                continue
            name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
            if "@sha256:" not in image and tag in ("", "latest"):
                violations.append(f"{where}: image {image} is not pinned (no tag, or latest)")
    return violations


def secret_outputs(required: Sequence[str], secret: set[str]) -> list[str]:
    return [f"stack output {name} is not secret" for name in required if name not in secret]


OBJECT_POLICIES = (no_cluster_admin, requests_and_limits, pinned_images, restricted_pods)


def violations(objects: Sequence[dict]) -> list[str]:
    return [violation for policy in OBJECT_POLICIES for violation in policy(objects)]


# Google Cloud resources, as declared (type token and inputs, camelCase as Pulumi sends them).
BUCKET = "gcp:storage/bucket:Bucket"
SERVICE_ACCOUNT_KEY = "gcp:serviceaccount/key:Key"
SQL_INSTANCE = "gcp:sql/databaseInstance:DatabaseInstance"
SQL_USER = "gcp:sql/user:User"
IAM_USER_TYPES = ("CLOUD_IAM_USER", "CLOUD_IAM_SERVICE_ACCOUNT", "CLOUD_IAM_GROUP")


def private_buckets(resources: Sequence) -> list[str]:
    """Every bucket: public access prevention enforced, uniform bucket-level access, versioning."""
    violations = []
    for bucket in (r for r in resources if r.type == BUCKET):
        inputs = bucket.inputs
        if inputs.get("publicAccessPrevention") != "enforced":
            violations.append(f"bucket {bucket.name}: public access prevention is not enforced")
        if inputs.get("uniformBucketLevelAccess") is not True:
            violations.append(f"bucket {bucket.name}: uniform bucket-level access is off")
        if (inputs.get("versioning") or {}).get("enabled") is not True:
            violations.append(f"bucket {bucket.name}: versioning is off")
    return violations


def no_service_account_keys(resources: Sequence) -> list[str]:
    return [f"{r.name}: a service account key; use Workload Identity" for r in resources
            if r.type == SERVICE_ACCOUNT_KEY]


def private_databases(resources: Sequence) -> list[str]:
    """Every Cloud SQL instance: no public address, IAM database authentication on, connections
    through the Auth Proxy (or a connector) only; every database user an IAM principal: no password."""
    violations = []
    for instance in (r for r in resources if r.type == SQL_INSTANCE):
        settings = instance.inputs.get("settings") or {}
        if (settings.get("ipConfiguration") or {}).get("ipv4Enabled") is not False:
            violations.append(f"Cloud SQL instance {instance.name}: it has a public address")
        flags = {flag.get("name"): flag.get("value") for flag in settings.get("databaseFlags") or []}
        if flags.get("cloudsql.iam_authentication") != "on":
            violations.append(f"Cloud SQL instance {instance.name}: IAM database authentication is off")
        if settings.get("connectorEnforcement") != "REQUIRED":
            violations.append(f"Cloud SQL instance {instance.name}: direct connections are allowed")
    for user in (r for r in resources if r.type == SQL_USER):
        if user.inputs.get("type") not in IAM_USER_TYPES or "password" in user.inputs:
            violations.append(f"Cloud SQL user {user.name}: a password user; use IAM authentication")
    return violations


GKE_CLUSTER = "gcp:container/cluster:Cluster"
GKE_NODE_POOL = "gcp:container/nodePool:NodePool"
OPEN_RANGES = frozenset({gke.EVERYONE, "0.0.0.0/0", "::/0"})  # in a firewall, Cloud Armor or an allowlist
FIREWALL = "gcp:compute/firewall:Firewall"
NETWORK_POLICY_DATAPATH = "ADVANCED_DATAPATH"  # Dataplane V2 enforces NetworkPolicy always


def closed_clusters(resources: Sequence) -> list[str]:
    """Every GKE cluster: private nodes (on the cluster and each pool), a public IP endpoint (if any)
    limited to named ranges, never everyone, and NetworkPolicy enforced (Dataplane V2, or the Calico
    network policy add-on): a policy declared but not enforced reads as protection."""
    violations = []
    for cluster in (r for r in resources if r.type == GKE_CLUSTER):
        inputs = cluster.inputs
        private = inputs.get("privateClusterConfig") or {}
        if private.get("enablePrivateNodes") is not True:
            violations.append(f"GKE cluster {cluster.name}: its nodes have public addresses "
                              "(privateClusterConfig.enablePrivateNodes is not true)")
        if private.get("enablePrivateEndpoint") is not True:
            authorized = inputs.get("masterAuthorizedNetworksConfig")
            blocks = [block.get("cidrBlock") for block in (authorized or {}).get("cidrBlocks") or []]
            if authorized is None or not blocks or any(block in OPEN_RANGES for block in blocks) \
                    or authorized.get("gcpPublicCidrsAccessEnabled") is not False:
                violations.append(f"GKE cluster {cluster.name}: its public endpoint is open to everyone "
                                  f"(authorized networks: {', '.join(blocks) or 'none'}); name the ranges "
                                  "that may reach it, or make it private and use the DNS-based endpoint")
        enforced = inputs.get("datapathProvider") == NETWORK_POLICY_DATAPATH or (
            (inputs.get("networkPolicy") or {}).get("enabled") is True)
        if not enforced:
            violations.append(f"GKE cluster {cluster.name}: NetworkPolicy is not enforced (no Dataplane V2, "
                              f"datapathProvider {NETWORK_POLICY_DATAPATH}, nor the network policy add-on)")
    for pool in (r for r in resources if r.type == GKE_NODE_POOL):
        if (pool.inputs.get("networkConfig") or {}).get("enablePrivateNodes") is False:
            violations.append(f"GKE node pool {pool.name}: its nodes have public addresses")
    return violations


def closed_firewalls(resources: Sequence) -> list[str]:
    """No ingress rule the stack declares lets everyone in: the webhooks' rule opens the nodes to the
    control plane's range only (infra/network.py)."""
    violations = []
    for rule in (r for r in resources if r.type == FIREWALL):
        if str(rule.inputs.get("direction", "INGRESS")) != "INGRESS":
            continue
        ranges = set(rule.inputs.get("sourceRanges") or [])
        if not ranges or ranges & OPEN_RANGES:
            sources = ", ".join(sorted(ranges)) or "any source"
            violations.append(f"firewall rule {rule.name}: lets in {sources}; name the ranges that may "
                              "reach the nodes")
    return violations


def tested_kubernetes(resources: Sequence) -> list[str]:
    """The cluster's minor (GKE's minMasterVersion; on every kind, the Pod Security version each
    namespace enforces, which the stacks pin to the cluster's minor) inside every installed controller's
    tested range (common/kubernetes_support.py)."""
    minors: dict[str, str] = {}
    for resource in resources:
        if resource.type == GKE_CLUSTER and isinstance(resource.inputs.get("minMasterVersion"), str):
            minors.setdefault(resource.inputs["minMasterVersion"], f"GKE cluster {resource.name}")
        elif resource.type == "kubernetes:core/v1:Namespace":
            labels = (resource.inputs.get("metadata") or {}).get("labels") or {}
            version = labels.get(pod_security.ENFORCE_VERSION_LABEL)
            if isinstance(version, str):
                minors.setdefault(version.removeprefix("v"), f"namespace {resource.name}")
    return [f"{where}: Kubernetes {minor} is outside the tested range of {', '.join(outside)}"
            for minor, where in minors.items() if (outside := untested(minor))]


CLOUD_POLICIES = (private_buckets, no_service_account_keys, private_databases, closed_clusters,
                  closed_firewalls)


def cloud_violations(resources: Sequence) -> list[str]:
    return [violation for policy in CLOUD_POLICIES for violation in policy(resources)]

# --- Endpoints: nothing public without HTTPS and an access control ----------------------------------

SECURITY_POLICY = "gcp:compute/securityPolicy:SecurityPolicy"


def _closing_rules(policy: Any) -> list[str]:
    """What keeps a Cloud Armor policy (as declared) from being an allowlist: an allow rule for
    everyone, or a default rule (the last evaluated) that does not deny."""
    problems, default = [], None
    for rule in policy.inputs.get("rules") or []:
        config = (rule.get("match") or {}).get("config") or {}
        ranges = set(config.get("srcIpRanges") or config.get("src_ip_ranges") or [])
        if int(rule.get("priority", -1)) == gke.DEFAULT_RULE_PRIORITY:
            default = rule
        elif str(rule.get("action")) == gke.ALLOW and ranges & OPEN_RANGES:
            problems.append(f"rule {int(rule['priority'])} allows everyone")
    if default is None or not str(default.get("action", "")).startswith("deny"):
        problems.append(f"its default rule (priority {gke.DEFAULT_RULE_PRIORITY}) does not deny")
    return problems


def _access_control(backend_policy: dict, armor: dict[str, Any]) -> str | None:
    """None if the GCPBackendPolicy holds an access control: a declared Cloud Armor allowlist, or IAP
    with an OAuth client; else why not."""
    default = (backend_policy.get("spec") or {}).get("default") or {}
    iap = default.get("iap") or {}
    if iap.get("enabled") is True and iap.get("clientID"):
        return None
    name = default.get("securityPolicy")
    if name is None:
        return "neither a Cloud Armor policy nor IAP"
    if name not in armor:
        return f"Cloud Armor policy {name} is not declared by the stack"
    problems = _closing_rules(armor[name])
    return f"Cloud Armor policy {name}: {'; '.join(problems)}" if problems else None


def _redirects_only(route: dict) -> bool:
    rules = (route.get("spec") or {}).get("rules") or []
    return bool(rules) and all(not rule.get("backendRefs") and rule.get("filters") and all(
        f.get("type") == "RequestRedirect" and (f.get("requestRedirect") or {}).get("scheme") == "https"
        for f in rule["filters"]) for rule in rules)


def _predictor_services(objects: Sequence[dict]) -> set[str]:
    """The Services KServe makes for the InferenceServices the stack's workflow deploys (stable and
    canary): what a route to the model sends requests to."""
    names = {node["metadata"]["name"] for manifest in objects
             for _, node in _walk(manifest, name_of(manifest))
             if node.get("kind") == "InferenceService" and "name" in (node.get("metadata") or {})}
    return {predictor_deployment_name(n) for name in names for n in (name, canary_name(name))}


def _in_namespace(objects: Sequence[dict], kind: str, namespace: str | None) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind and o["metadata"].get("namespace") == namespace]


def _listener_violations(gateway: dict, routes: list[dict]) -> list[str]:
    """HTTPS listeners need a certificate; any other listener may only redirect to HTTPS."""
    where, name = name_of(gateway), gateway["metadata"]["name"]
    certmap = (gateway["metadata"].get("annotations") or {}).get(gke.CERTMAP_ANNOTATION)
    violations = []
    for listener in gateway["spec"].get("listeners") or []:
        tls = listener.get("tls") or {}
        if listener.get("protocol") == "HTTPS":
            if not (certmap or tls.get("certificateRefs") or tls.get("options")):
                violations.append(f"{where}: HTTPS listener {listener['name']} has no certificate")
            continue
        attached = [route for route in routes if any(
            ref.get("name") == name and ref.get("sectionName") == listener["name"]
            for ref in route["spec"].get("parentRefs") or [])]
        if not attached or not all(_redirects_only(route) for route in attached):
            violations.append(f"{where}: {listener.get('protocol')} listener {listener['name']} is public "
                              "without TLS; it may only redirect to HTTPS")
    return violations


def _backend_violations(gateway: dict, objects: Sequence[dict], armor: dict[str, Any]) -> list[str]:
    """Every predictor Service a route may send to has a GCPBackendPolicy with an access control (at
    least one backend has, when no InferenceService is declared)."""
    where, namespace = name_of(gateway), gateway["metadata"].get("namespace")
    guarded = {(policy["spec"].get("targetRef") or {}).get("name"): _access_control(policy, armor)
               for policy in _in_namespace(objects, gke.BACKEND_POLICY_KIND, namespace)}
    services = _predictor_services(objects)
    if not services:
        return [] if None in guarded.values() else [f"{where}: no backend has an access control"]
    problems = {service: guarded.get(service, "no GCPBackendPolicy") for service in sorted(services)}
    return [f"{where}: Service {service} is public without an access control ({problem})"
            for service, problem in problems.items() if problem]


def public_endpoints(objects: Sequence[dict], resources: Sequence) -> list[str]:
    """A Gateway of an external GKE class serves HTTPS with a certificate, its plain-HTTP listeners
    only redirect to HTTPS, and every backend behind it has an access control. The model's own route,
    which the workflow creates at run time, is not among the declared objects: it names the model
    listener alone (cluster_steps.release; tests/test_cluster_contracts.py)."""
    armor = {r.inputs.get("name"): r for r in resources if r.type == SECURITY_POLICY}
    violations = []
    for gateway in objects:
        if gateway.get("kind") != "Gateway" or (
                gateway.get("spec") or {}).get("gatewayClassName") not in gke.EXTERNAL_GATEWAY_CLASSES:
            continue
        routes = _in_namespace(objects, "HTTPRoute", gateway["metadata"].get("namespace"))
        violations += _listener_violations(gateway, routes) + _backend_violations(gateway, objects, armor)
    return violations
