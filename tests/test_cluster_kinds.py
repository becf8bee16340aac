"""A third cluster kind is one module and one registry line: a fake kind, defined in this module the
way stacks/kinds/k3d.py and gke.py are, is registered in KINDS, and the whole stack renders on it —
its config parsed by its own model, its cluster, images, storage and identity used by the one
composition, every object valid, and the same actors' contracts holding."""

from __future__ import annotations

import json
from typing import Literal

import pulumi
import pulumi_kubernetes as k8s
import pytest
from conftest import REPO_ROOT
from pydantic import Field
from stack_checks import embedded, objects_of, validate_all

from common.cluster_target import KUBERNETES_MINOR, Images
from infra.gateway import GatewayPlacement
from infra.storage import PvcStorage, PvcStorageArgs
from infra.tracking import SERVER_ACCOUNT, VolumeBackend
from pipeline.validation import ConfigError, Section
from stacks import kinds, render
from stacks.config import parse_stack_config
from stacks.kinds.base import Cluster, ClusterKind, ImageSource, Storage, TrackingPlacement, TrainingPlacement
from stacks.kinds.k3d import StorageConfig
from stacks.settings import StackSettings

IDENTITY = {"identity.fake.example/account": "fake-storage-user"}
IMAGES = Images(trainer="registry.fake.example/trainer:1.0", serving="registry.fake.example/serving:1.0",
                tracking_server="registry.fake.example/tracking-server:1.0")
PLACEMENT = TrainingPlacement(pool="training", quota={"cpu": "8", "memory": "32Gi"},
                              node_selector={"fake.example/pool": "training"})
GATEWAY = GatewayPlacement("fake-gateway-class", 8080, url="http://gateway.fake.example")


class FakeCluster(Section):
    """The `cluster` section of the fake kind."""
    kind: Literal["fake"] = Field(description="the stack's cluster")
    name: str = Field("fake", description="the cluster's name")
    kubernetes_version: str = Field(KUBERNETES_MINOR, description="the cluster's Kubernetes minor")


class FakeStack(StackSettings):
    """A stack on the fake kind: its cluster, and a PVC for storage."""
    cluster: FakeCluster = Field(description="the fake cluster")
    storage: StorageConfig = Field(StorageConfig(), description="the PVC every pipeline pod mounts")


class FakeKind(ClusterKind):
    settings = FakeStack

    def cluster(self) -> Cluster:
        kubeconfig = pulumi.Output.secret("apiVersion: v1\nkind: Config\n")
        provider = k8s.Provider("cluster-provider", kubeconfig=kubeconfig)
        return Cluster(provider=provider, kubeconfig=kubeconfig)

    def images(self, cluster: Cluster) -> ImageSource:
        return ImageSource(images=IMAGES)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        config = self.config.storage
        claim = PvcStorage("storage", PvcStorageArgs(
            namespace=self.config.namespace, size=config.size, access_mode=config.access_mode,
            storage_class=config.storage_class, provider=cluster.provider, depends_on=[namespace]))
        return Storage(storage=claim.storage, ready=[claim], account_annotations=IDENTITY)

    def training_placement(self) -> TrainingPlacement:
        return PLACEMENT

    def tracking(self, cluster: Cluster, service_account: str) -> TrackingPlacement:
        return TrackingPlacement(VolumeBackend(storage_class="fake-disks"))

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        return GATEWAY

    def outputs(self, images: ImageSource) -> dict[str, pulumi.Input]:
        return {"fakeCluster": self.config.cluster.name}


@pytest.fixture
def fake_kind(monkeypatch):
    monkeypatch.setitem(kinds.KINDS, "fake", FakeKind)  # the one registry line


def fake_values() -> dict[str, str]:
    local = render.pulumi_values(REPO_ROOT / "Pulumi.local.yaml")
    shared = {key: value for key, value in local.items() if key.split(":")[1] in ("pipeline", "serving")}
    return {**shared, "dist-ml:cluster": json.dumps({"kind": "fake", "name": "lab"})}


def test_the_whole_stack_renders_on_a_plugged_in_kind(fake_kind, validate_crd):
    rendered = render.render("fake", fake_values())
    types = {resource.type for resource in rendered.resources}
    assert {f"dist-ml:infra:{c}" for c in ("Platform", "PvcStorage", "Pipeline", "Serving")} <= types
    assert "dist-ml:infra:K3dCluster" not in types and "dist-ml:infra:GkeCluster" not in types
    assert validate_all(rendered, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    template = objects_of(rendered, "WorkflowTemplate")[0]
    # The kind's images, placement and identity reach every object that uses them.
    assert embedded(template, "train-cnn")["spec"]["trainer"]["image"] == IMAGES.trainer
    (runtime,) = objects_of(rendered, "ClusterTrainingRuntime")
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["nodeSelector"] == PLACEMENT.node_selector
    (flavor,) = objects_of(rendered, "ResourceFlavor")
    assert (flavor["metadata"]["name"], flavor["spec"]["nodeLabels"]) == ("dist-ml-training",
                                                                          PLACEMENT.node_selector)
    (queue,) = objects_of(rendered, "ClusterQueue")
    (quota,) = queue["spec"]["resourceGroups"][0]["flavors"]
    assert {r["name"]: r["nominalQuota"] for r in quota["resources"]} == PLACEMENT.quota
    assert embedded(template, "serve")["spec"]["predictor"]["containers"][0]["image"] == IMAGES.serving
    accounts = {a["metadata"]["name"]: a for a in objects_of(rendered, "ServiceAccount")}
    tracking = accounts.pop(SERVER_ACCOUNT)  # the tracking server's: its backend's identity, none here
    assert not tracking["metadata"].get("annotations")
    assert len(accounts) == 4 and all(a["metadata"]["annotations"] == IDENTITY for a in accounts.values())
    (server,) = [d for d in objects_of(rendered, "Deployment") if d["metadata"]["name"] == "mlflow"]
    assert server["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGES.tracking_server
    assert rendered.outputs["fakeCluster"] == "lab"
    assert rendered.outputs["inferenceService"] == "dist-ml/fmnist"
    (gateway,) = objects_of(rendered, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == GATEWAY.class_name
    assert rendered.outputs["inferenceUrl"] == "http://gateway.fake.example/v1/models/fmnist:predict"


def test_a_plugged_in_kind_parses_its_own_config_and_refuses_the_others_keys(fake_kind):
    config = parse_stack_config({"cluster": {"kind": "fake", "name": "lab"}})
    assert config.cluster_kind == "fake" and config.cluster.name == "lab"
    with pytest.raises(ConfigError, match="^cluster.agents: "):
        parse_stack_config({"cluster": {"kind": "fake", "agents": 2}})
    kinds = "k3d, gke, existing, fake"
    with pytest.raises(ConfigError, match=f"^cluster.kind: must be one of {kinds}, got 'eks'"):
        parse_stack_config({"cluster": {"kind": "eks"}})


def test_without_its_registry_line_the_kind_does_not_exist():
    with pytest.raises(ConfigError, match="^cluster.kind: must be one of k3d, gke, existing, got 'fake'"):
        parse_stack_config({"cluster": {"kind": "fake"}})
