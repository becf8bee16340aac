"""Every NetworkPolicy a stack declares is enforced on the cluster that stack makes: a policy declared
but not enforced reads as protection. On k3d, k3s' embedded network policy controller (kube-router's)
enforces them unless k3s is started with `--disable-network-policy` or without flannel
(docs.k3s.io/networking/networking-services, "Network Policy Controller"); on GKE, Dataplane V2 does
(stacks.policies.closed_clusters, which the policy pack runs too). What k3s enforces is then run for
real: the e2e tier's node runs kube-router's controller from k3s' fork, and
tests/e2e_node/test_node.py has the tracking server's policy admit the pipeline's namespace alone."""

from __future__ import annotations

from conftest import REPO_ROOT
from stack_checks import rendered_stack, stack_values

from stacks import policies, render

K3S_WITHOUT_ENFORCEMENT = ("--disable-network-policy", "--flannel-backend=none")


def unenforced(rendered: render.Rendered) -> list[str]:
    """Why the stack's NetworkPolicies would not be enforced; nothing when it declares none."""
    if not any(obj["kind"] == "NetworkPolicy" for obj in rendered.objects):
        return []
    k3d = [r.inputs["create"] for r in rendered.of_type("command:local:Command")
           if str(r.inputs.get("create", "")).startswith("k3d cluster create")]
    found = [f"k3s started with {flag}" for create in k3d for flag in K3S_WITHOUT_ENFORCEMENT
             if flag in create]
    clusters = rendered.of_type(policies.GKE_CLUSTER)
    found += [v for v in policies.closed_clusters(clusters) if "NetworkPolicy is not enforced" in v]
    if not k3d and not clusters:
        found.append("no cluster of the stack's own: nothing known enforces its NetworkPolicies")
    return found


def test_each_stacks_network_policies_are_enforced_by_the_cluster_it_makes():
    for stack, values in (("local", stack_values(REPO_ROOT / "Pulumi.local.yaml")),
                          ("gke", {**stack_values(REPO_ROOT / "Pulumi.gke.yaml"), "gcp:project": "p-4821"})):
        rendered = rendered_stack(stack, values)
        assert any(obj["kind"] == "NetworkPolicy" for obj in rendered.objects), stack
        assert unenforced(rendered) == [], stack


def test_a_cluster_that_would_not_enforce_them_is_named():
    rendered = rendered_stack("local", stack_values(REPO_ROOT / "Pulumi.local.yaml"))
    (create,) = [r for r in rendered.of_type("command:local:Command")
                 if r.inputs["create"].startswith("k3d cluster create")]
    create.inputs["create"] += " --k3s-arg=--disable-network-policy@server:*"
    assert unenforced(rendered) == ["k3s started with --disable-network-policy"]
