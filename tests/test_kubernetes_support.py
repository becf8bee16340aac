"""The tested Kubernetes ranges (common/kubernetes_support.py): the stacks' minor inside each, the pins
they name the stacks' own, and the policy that holds a stack's cluster to them."""

from __future__ import annotations

import types

from common import kubernetes_support
from common.cluster_target import DEFAULT_ARGO_VERSION, KUBERNETES_MINOR
from stacks import policies
from stacks.settings import PlatformConfig

PINNED_BY_THE_STACKS = {"Kubeflow Trainer": "trainer_version", "Kueue": "kueue_version",
                        "KServe": "kserve_version", "KEDA": "keda_version",
                        "cert-manager": "cert_manager_version"}


def test_the_stacks_minor_is_inside_every_controllers_tested_range():
    assert kubernetes_support.untested(KUBERNETES_MINOR) == []


def test_a_minor_past_a_range_names_the_controllers_it_leaves():
    assert kubernetes_support.untested("1.36") == ["Kubeflow Trainer v2.3.0 (tested on 1.32 – 1.35)",
                                                   "KServe v0.20.0 (tested on 1.34; the tier: 1.35)"]
    assert len(kubernetes_support.untested("1.31")) == len(kubernetes_support.TESTED_RANGES)


def test_each_range_is_of_the_version_the_stacks_install():
    defaults = PlatformConfig()
    for tested in kubernetes_support.TESTED_RANGES:
        if tested.controller in PINNED_BY_THE_STACKS:
            pinned = getattr(defaults, PINNED_BY_THE_STACKS[tested.controller])
            assert pinned == tested.pinned, tested.controller
    (argo,) = [t for t in kubernetes_support.TESTED_RANGES if t.controller == "Argo Workflows"]
    assert argo.pinned == DEFAULT_ARGO_VERSION


def test_the_policy_refuses_a_cluster_outside_a_tested_range():
    cluster = types.SimpleNamespace(type=policies.GKE_CLUSTER, name="cluster",
                                    inputs={"minMasterVersion": "1.36"})
    namespace = types.SimpleNamespace(type="kubernetes:core/v1:Namespace", name="namespace", inputs={
        "metadata": {"labels": {"pod-security.kubernetes.io/enforce-version": f"v{KUBERNETES_MINOR}"}}})
    assert policies.tested_kubernetes([cluster, namespace]) == [
        "GKE cluster cluster: Kubernetes 1.36 is outside the tested range of Kubeflow Trainer v2.3.0 (tested "
        "on 1.32 – 1.35), KServe v0.20.0 (tested on 1.34; the tier: 1.35)"]
