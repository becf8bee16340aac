"""The policy pack (policy/) runs stacks/policies.py's checks over what Pulumi's policy engine hands it:
both stacks pass, and a stack with a violation of each kind is reported, once per violation."""

from __future__ import annotations

import types

import pytest
import yaml
from conftest import REPO_ROOT
from test_cluster_contracts import stack_values

from stacks import policies, policy_pack, render


def as_policy_resources(rendered: render.Rendered) -> list[types.SimpleNamespace]:
    """The stack's resources as the policy engine describes them: type token, name, properties."""
    return [types.SimpleNamespace(resource_type=r.type, name=r.name,
                                  props=render.integral_floats_as_ints(r.inputs))
            for r in rendered.resources if r.custom]


def reported(resources: list) -> dict[str, list[str]]:
    found = {}
    for name, (_, check) in policy_pack.POLICIES.items():
        violations = []
        policy_pack.stack_validator(check)(types.SimpleNamespace(resources=resources),
                                           lambda message, urn: violations.append(message))
        found[name] = violations
    return found


@pytest.mark.parametrize("stack", ["local", "gke"])
def test_both_stacks_pass_every_policy(stack):
    resources = as_policy_resources(render.render(stack, stack_values(stack)))
    assert len(policy_pack.kubernetes_objects(policy_pack.declared(resources))) >= 15
    assert reported(resources) == {name: [] for name in policy_pack.POLICIES}


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
    ]
    found = reported(bad)
    assert found["no-cluster-admin"] == ["ClusterRoleBinding/admin binds cluster-admin"]
    (pinned,) = found["pinned-images"]
    assert pinned.startswith("Deployment/loose.spec.template.spec.containers[0]: image busybox:latest")
    assert len(found["requests-and-limits"]) == 2  # no requests, no limits
    assert len(found["private-buckets"]) == 3 and found["no-service-account-keys"] == [
        "key: a service account key; use Workload Identity"]


def test_the_pack_runs_in_its_own_virtualenv_with_pulumi_policy():
    pack = yaml.safe_load((REPO_ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert pack["runtime"]["name"] == "python" and pack["runtime"]["options"]["virtualenv"] == "venv"
    pins = (REPO_ROOT / "policy" / "requirements.txt").read_text().splitlines()
    assert "pulumi-policy==1.21.0" in pins
    source = (REPO_ROOT / "policy" / "__main__.py").read_text()
    assert "for name, (description, check) in POLICIES.items()" in source
