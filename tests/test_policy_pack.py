"""The policy pack (policy/) runs stacks/policies.py's checks over what Pulumi's policy engine hands it:
both stacks pass, and a stack with a violation of each kind is reported, once per violation."""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping

import pytest
import yaml
from conftest import REPO_ROOT
from google.protobuf import json_format, struct_pb2
from stack_checks import rendered_stack
from test_cluster_contracts import public_gke_values, stack_values

from stacks import policies, policy_pack, render
from stacks.declared import UNKNOWN, kubernetes_objects, plain


def as_policy_resources(rendered: render.Rendered) -> list[types.SimpleNamespace]:
    """The stack's resources as the policy engine describes them: type token, name, and properties
    through a protobuf Struct, as the engine sends them (every number a float)."""
    return [types.SimpleNamespace(resource_type=r.type, name=r.name, props=through_struct(r.inputs))
            for r in rendered.resources if r.custom]


def through_struct(inputs: dict) -> dict:
    struct = struct_pb2.Struct()
    struct.update(inputs)
    return json_format.MessageToDict(struct)


def reported(resources: list) -> dict[str, list[str]]:
    found = {}
    for name, (_, check) in policy_pack.POLICIES.items():
        violations = []
        policy_pack.stack_validator(check)(types.SimpleNamespace(resources=resources),
                                           lambda message, urn: violations.append(message))
        found[name] = violations
    return found


@pytest.mark.parametrize("stack", ["local", "gke", "gke-public"])
def test_both_stacks_pass_every_policy(stack):
    values = public_gke_values() if stack == "gke-public" else stack_values(stack)
    resources = as_policy_resources(rendered_stack(stack.partition("-")[0], values))
    assert len(kubernetes_objects(policy_pack.declared(resources))) >= 15
    assert reported(resources) == {name: [] for name in policy_pack.POLICIES}


@pytest.mark.parametrize("stack", ["local", "gke"])
def test_the_pack_judges_the_objects_the_render_writes(stack):
    """One conversion (stacks/declared.py): what the policy engine hands over, numbers as floats,
    becomes the very manifests the render writes and the tests check."""
    rendered = rendered_stack(stack, stack_values(stack))
    objects = kubernetes_objects(policy_pack.declared(as_policy_resources(rendered)))
    assert objects == rendered.objects and len(objects) >= 15


class UnknownDuringPreview(Exception):
    pass


class EngineProxy(Mapping):
    """A read-only Mapping, not a dict, raising on its unknown items: what the engine hands over."""

    def __init__(self, items: dict, unknown: set[str]) -> None:
        self.items_, self.unknown = items, unknown

    def __getitem__(self, key):
        if key in self.unknown:
            raise UnknownDuringPreview(key)
        return self.items_[key]

    def __iter__(self):
        return iter(self.items_)

    def __len__(self):
        return len(self.items_)


def test_mappings_sequences_floats_and_unknowns_read_as_plain_data():
    props = EngineProxy({"spec": EngineProxy({"replicas": 2.0, "ratio": 0.5, "ports": (80.0, "http"),
                                              "image": "sentinel"}, {"image"})}, set())
    assert plain(props, UnknownDuringPreview) == {
        "spec": {"replicas": 2, "ratio": 0.5, "ports": [80, "http"], "image": UNKNOWN}}
    with pytest.raises(UnknownDuringPreview):
        plain(props)  # an error other than the one named is not swallowed


def test_each_violation_is_reported():
    bad = [
        types.SimpleNamespace(resource_type="kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
                              name="admin", props={"apiVersion": "rbac.authorization.k8s.io/v1",
                                                   "kind": "ClusterRoleBinding", "metadata": {},
                                                   "roleRef": {"name": "cluster-admin"}, "subjects": []}),
        types.SimpleNamespace(resource_type="kubernetes:apps/v1:Deployment", name="loose", props={
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "loose"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:latest"}]}}}}),
        types.SimpleNamespace(resource_type=policies.BUCKET, name="open",
                              props={"versioning": {"enabled": False}}),
        types.SimpleNamespace(resource_type=policies.SERVICE_ACCOUNT_KEY, name="key", props={}),
        types.SimpleNamespace(resource_type=policies.SQL_INSTANCE, name="public-db", props={
            "settings": {"ipConfiguration": {"ipv4Enabled": True}}}),
        types.SimpleNamespace(resource_type=policies.SQL_USER, name="admin",
                              props={"type": "BUILT_IN", "password": "hunter2"}),
        # GKE's defaults: public nodes, a public endpoint open to all, no NetworkPolicy enforcement.
        types.SimpleNamespace(resource_type=policies.GKE_CLUSTER, name="open-cluster", props={}),
        types.SimpleNamespace(resource_type=policies.GKE_CLUSTER, name="anyone", props={
            "privateClusterConfig": {"enablePrivateNodes": True},
            "masterAuthorizedNetworksConfig": {"cidrBlocks": [{"cidrBlock": "0.0.0.0/0"}],
                                               "gcpPublicCidrsAccessEnabled": False},
            "datapathProvider": "ADVANCED_DATAPATH"}),
        types.SimpleNamespace(resource_type=policies.GKE_NODE_POOL, name="public-pool",
                              props={"networkConfig": {"enablePrivateNodes": False}}),
        types.SimpleNamespace(resource_type=policies.FIREWALL, name="webhooks-from-anywhere", props={
            "direction": "INGRESS", "sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp"}]}),
        types.SimpleNamespace(resource_type=policies.FIREWALL, name="egress", props={
            "direction": "EGRESS", "destinationRanges": ["0.0.0.0/0"]}),
    ]
    found = reported(bad)
    assert found["no-cluster-admin"] == ["ClusterRoleBinding/admin binds cluster-admin"]
    (pinned,) = found["pinned-images"]
    assert pinned.startswith("Deployment/loose.spec.template.spec.containers[0]: image busybox:latest")
    assert len(found["requests-and-limits"]) == 2  # no requests, no limits
    assert len(found["restricted-pods"]) == 4  # not non-root, no seccomp, escalation, capabilities
    assert len(found["private-buckets"]) == 3 and found["no-service-account-keys"] == [
        "key: a service account key; use Workload Identity"]
    assert found["private-databases"] == [
        "Cloud SQL instance public-db: it has a public address",
        "Cloud SQL instance public-db: IAM database authentication is off",
        "Cloud SQL instance public-db: direct connections are allowed",
        "Cloud SQL user admin: a password user; use IAM authentication"]
    assert found["closed-clusters"] == [
        "GKE cluster open-cluster: its nodes have public addresses (privateClusterConfig.enablePrivateNodes "
        "is not true)",
        "GKE cluster open-cluster: its public endpoint is open to everyone (authorized networks: none); name "
        "the ranges that may reach it, or make it private and use the DNS-based endpoint",
        "GKE cluster open-cluster: NetworkPolicy is not enforced (no Dataplane V2, datapathProvider "
        "ADVANCED_DATAPATH, nor the network policy add-on)",
        "GKE cluster anyone: its public endpoint is open to everyone (authorized networks: 0.0.0.0/0); name "
        "the ranges that may reach it, or make it private and use the DNS-based endpoint",
        "GKE node pool public-pool: its nodes have public addresses"]
    assert found["closed-firewalls"] == [
        "firewall rule webhooks-from-anywhere: lets in 0.0.0.0/0; name the ranges that may reach the nodes"]


@pytest.fixture(scope="module")
def public_resources() -> list[types.SimpleNamespace]:
    return as_policy_resources(rendered_stack("gke", public_gke_values()))


def changed(resources: list, kind_or_type: str, change, name: str | None = None) -> list:
    """A copy of `resources` where `change(props)` edited those of that kind (or type) and name."""
    edited = copy.deepcopy(resources)
    for resource in edited:
        props = resource.props
        if kind_or_type in (resource.resource_type, props.get("kind")) and name in (
                None, (props.get("metadata") or {}).get("name")):
            change(props)
    return edited


def without(resources: list, kind: str, name: str) -> list:
    return [r for r in resources if not (r.props.get("kind") == kind and r.props["metadata"]["name"] == name)]


def plain_http_model_listener(gateway: dict) -> None:
    gateway["metadata"].pop("annotations")
    gateway["spec"]["listeners"][0].update(protocol="HTTP", port=8080)


def default_rule(action: str):
    def change(armor: dict) -> None:
        for rule in armor["rules"]:
            if rule["priority"] == 2147483647:
                rule["action"] = action
    return change


def allow_everyone(armor: dict) -> None:
    armor["rules"][0]["match"]["config"]["srcIpRanges"] = ["*"]


def with_backend(route: dict) -> None:
    route["spec"]["rules"][0]["backendRefs"] = [{"name": "fmnist-predictor", "port": 80}]


def iap_instead_of_armor(policy: dict) -> None:
    policy["spec"]["default"] = {"iap": {"enabled": True, "clientID": "123-abc.apps.googleusercontent.com",
                                         "oauth2ClientSecret": {"name": "iap-client"}}}


GATEWAY = "Gateway/dist-ml"
ARMOR = "gcp:compute/securityPolicy:SecurityPolicy"
REFUSED_ENDPOINTS = {
    "model served on plain HTTP": (lambda r: changed(r, "Gateway", plain_http_model_listener),
                                   [f"{GATEWAY}: HTTP listener model is public without TLS; it may only "
                                    "redirect to HTTPS"]),
    "HTTPS without a certificate": (
        lambda r: changed(r, "Gateway", lambda gateway: gateway["metadata"].pop("annotations")),
        [f"{GATEWAY}: HTTPS listener model has no certificate"]),
    "HTTP listener without its redirect": (
        lambda r: without(r, "HTTPRoute", "dist-ml-https-redirect"),
        [f"{GATEWAY}: HTTP listener http-redirect is public without TLS; it may only redirect to HTTPS"]),
    "HTTP listener routing to the model": (
        lambda r: changed(r, "HTTPRoute", with_backend),
        [f"{GATEWAY}: HTTP listener http-redirect is public without TLS; it may only redirect to HTTPS"]),
    "canary without a backend policy": (
        lambda r: without(r, "GCPBackendPolicy", "fmnist-canary-predictor"),
        [f"{GATEWAY}: Service fmnist-canary-predictor is public without an access control "
         "(no GCPBackendPolicy)"]),
    "allowlist whose default allows": (
        lambda r: changed(r, ARMOR, default_rule("allow")),
        [f"{GATEWAY}: Service {s} is public without an access control (Cloud Armor policy dist-ml-model: "
         "its default rule (priority 2147483647) does not deny)" for s in ("fmnist-canary-predictor",
                                                                           "fmnist-predictor")]),
    "allowlist letting everyone in": (
        lambda r: changed(r, ARMOR, allow_everyone),
        [f"{GATEWAY}: Service {s} is public without an access control (Cloud Armor policy dist-ml-model: "
         "rule 1000 allows everyone)" for s in ("fmnist-canary-predictor", "fmnist-predictor")]),
    "allowlist the stack does not declare": (
        lambda r: [x for x in r if x.resource_type != ARMOR],
        [f"{GATEWAY}: Service {s} is public without an access control (Cloud Armor policy dist-ml-model is "
         "not declared by the stack)" for s in ("fmnist-canary-predictor", "fmnist-predictor")]),
}


@pytest.mark.parametrize("case", REFUSED_ENDPOINTS)
def test_a_public_endpoint_without_https_or_an_access_control_is_refused(public_resources, case):
    """What the stack's config refuses (tests/test_infra_gke.py), the pack refuses too, in whatever
    declared it: plain HTTP to the model, HTTPS without a certificate, a backend without an allowlist."""
    change, expected = REFUSED_ENDPOINTS[case]
    found = reported(change(public_resources))
    assert found["public-endpoints"] == expected
    assert all(found[name] == [] for name in found if name != "public-endpoints")


def test_iap_is_an_access_control_too(public_resources):
    with_iap = changed(public_resources, "GCPBackendPolicy", iap_instead_of_armor)
    assert reported(with_iap)["public-endpoints"] == []


def test_the_pack_runs_in_its_own_virtualenv_with_pulumi_policy():
    pack = yaml.safe_load((REPO_ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert pack["runtime"]["name"] == "python" and pack["runtime"]["options"]["virtualenv"] == "venv"
    pins = (REPO_ROOT / "policy" / "requirements.txt").read_text().splitlines()
    assert "pulumi-policy==1.21.0" in pins
    source = (REPO_ROOT / "policy" / "__main__.py").read_text()
    assert "for name, (description, check) in POLICIES.items()" in source
