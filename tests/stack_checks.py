"""What the stack tests share: the local stack's names, config edits in Pulumi's wire format, and schema
validation of everything a stack declares."""

from __future__ import annotations

import copy
import functools
import json
from typing import Mapping

import cluster_actors
import kubernetes_validate
import pulumi
import pytest
import yaml

from common import cluster_names
from pipeline import argo
from stacks import program, render
from stacks.render import stack_values as stack_values  # the tests take it from here
from tools.control_plane.stacks import local_config

CRDS = {"TFJob": "kubeflow.org_tfjobs.yaml", "InferenceService": "serving.kserve.io_inferenceservices.yaml",
        "TrainJob": "trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml",
        "ClusterTrainingRuntime": "trainer-v2.3.0/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "ResourceFlavor": "kueue-v0.19.2/kueue.x-k8s.io_resourceflavors.yaml",
        "ClusterQueue": "kueue-v0.19.2/kueue.x-k8s.io_clusterqueues.yaml",
        "LocalQueue": "kueue-v0.19.2/kueue.x-k8s.io_localqueues.yaml",
        "AdmissionCheck": "kueue-v0.19.2/kueue.x-k8s.io_admissionchecks.yaml",
        "ProvisioningRequestConfig": "kueue-v0.19.2/kueue.x-k8s.io_provisioningrequestconfigs.yaml",
        "Gateway": "gateway-api-v1.2.1/gateway.networking.k8s.io_gateways.yaml",
        "HTTPRoute": "gateway-api-v1.2.1/gateway.networking.k8s.io_httproutes.yaml"}
ARGO_CRDS = {"v4": "argo-v4.1.2/argoproj.io_{plural}.yaml", "v3": "argoproj.io_{plural}.yaml"}
# Prometheus Operator's kinds, and k3s's HelmChartConfig (its helm-controller generates the CRD in
# code, no file to pin): no upstream schema in testdata/pins.py, none in kubernetes-validate. GKE's
# GCPBackendPolicy: its CRD (GoogleCloudPlatform/gke-gateway-api) is in no package registry and not in
# ../shared/schemas, whence the pins come; tests/test_cluster_contracts.py checks the fields GKE reads.
UNCHECKED_KINDS = {"PodMonitor", "ServiceMonitor", "HelmChartConfig", "GCPBackendPolicy"}
# The local stack's names, as its program reads them from Pulumi.local.yaml: its namespace (where the
# workflow runs: what Argo substitutes for {{workflow.namespace}}) and its workflow's service account.
STACK_NAMESPACE = local_config().namespace
WORKFLOW_ACCOUNT = local_config().pipeline.service_account_name
WORKFLOW_NAME = "dist-ml-pipeline-x7k2p"  # what Argo substitutes for {{workflow.name}}
PUBLISHED_VERSION = "3"  # what select outputs, and the serve step receives


def rendered_stack(stack: str, values: Mapping[str, str]) -> render.Rendered:
    """render.render(stack, values), each stack and config rendered once per test process (many tests
    read the stack files' own configs), each caller given a copy of its own. A test that changes what
    the program reads (an engine or a cluster kind plugged in) renders for itself."""
    return copy.deepcopy(_rendered_once(stack, json.dumps(dict(values), sort_keys=True)))


@functools.cache
def _rendered_once(stack: str, values: str) -> render.Rendered:
    return render.render(stack, json.loads(values))


def objects_of(rendered: render.Rendered, kind: str) -> list[dict]:
    return [o for o in rendered.objects if o["kind"] == kind]


def workflow_namespace(rendered: render.Rendered) -> str:
    """The namespace a rendered stack runs its workflow in (its WorkflowTemplate's): the stack's own."""
    (template,) = objects_of(rendered, "WorkflowTemplate")
    return template["metadata"]["namespace"]


def as_submitted(text: str) -> str:
    """A template's text with Argo's placeholders as a run substitutes them."""
    return text.replace("{{workflow.name}}", WORKFLOW_NAME).replace(
        "{{workflow.namespace}}", STACK_NAMESPACE).replace(
        f"{{{{inputs.parameters.{argo.VERSION_PARAMETER}}}}}", PUBLISHED_VERSION)


WORKFLOW_UID = "0c1d9f1e-6f4a-4d47-9a56-2f0e3c1b7a10"  # what Argo substitutes for {{workflow.uid}}


def embedded(template: dict, name: str) -> dict:
    """The object one of a WorkflowTemplate's templates creates (a resource template's manifest, or
    the InferenceService the serve step rolls out), as a run submits it."""
    (found,) = [t for t in template["spec"]["templates"] if t["name"] == name]
    if "resource" in found:
        return yaml.safe_load(as_submitted(found["resource"]["manifest"]))
    return json.loads(as_submitted(json.dumps(argo.applied_manifest(found)).replace(
        "{{workflow.uid}}", WORKFLOW_UID)))


def creates_objects(template: dict) -> bool:
    args = template.get("container", {}).get("args", [])
    return "resource" in template or cluster_names.MANIFEST_FLAG in args


def validate_all(rendered: render.Rendered, validate_crd, argo_line: str, kubernetes_version: str) -> int:
    """Validates every declared object (and Argo's embedded manifests); returns how many."""
    checked = 0
    for manifest in rendered.objects:
        kind = manifest["kind"]
        if kind in UNCHECKED_KINDS:
            continue
        if kind in ("Workflow", "WorkflowTemplate"):
            crd = ARGO_CRDS[argo_line].format(plural=kind.lower() + "s")
            assert validate_crd(crd, manifest) == [], kind
            for template in manifest["spec"].get("templates", []):
                if creates_objects(template):
                    inner = embedded(manifest, template["name"])
                    assert validate_crd(CRDS[inner["kind"]], inner) == [], template["name"]
                    checked += 1
        elif kind in CRDS:
            assert validate_crd(CRDS[kind], manifest) == [], kind
        else:
            kubernetes_validate.validate(manifest, kubernetes_version, strict=True)
        checked += 1
    return checked


def config_error_before_any_resource(stack: str, values: dict[str, str]) -> str:
    """Runs the stack's program with config `values`: it must stop with a one-line config error
    before declaring anything; returns the error."""
    mocks = render.install_mocks(stack, values)
    with pytest.raises(pulumi.RunError) as error:
        program.main()
    assert mocks.declared == []
    return str(error.value)


# --- The training pods a train step would run ------------------------------------------------------

def template_of(rendered: render.Rendered) -> dict:
    (template,) = objects_of(rendered, "WorkflowTemplate")
    return template


def named(rendered: render.Rendered, kind: str, name: str, namespace: str | None = None) -> dict:
    (found,) = [o for o in objects_of(rendered, kind) if o["metadata"]["name"] == name
                and (namespace is None or o["metadata"].get("namespace") == namespace)]
    return found


def train_steps(rendered: render.Rendered) -> list[str]:
    return [t["name"] for t in template_of(rendered)["spec"]["templates"] if t["name"].startswith("train-")]


def runtime_of(rendered: render.Rendered, trainjob: dict) -> dict:
    return named(rendered, "ClusterTrainingRuntime", trainjob["spec"]["runtimeRef"]["name"])


def trainer_jobset(rendered: render.Rendered, step: str) -> dict:
    """The JobSet Trainer v2 makes of a train step's TrainJob, which the step creates where the workflow
    runs."""
    trainjob = embedded(template_of(rendered), step)
    runtime = runtime_of(rendered, trainjob)
    return cluster_actors.trainer_jobset(runtime, trainjob, workflow_namespace(rendered))


def training_pods(rendered: render.Rendered, step: str) -> list[dict]:
    """Every pod a train step's job would run, its node pods first (a TrainJob's) or its workers'."""
    job = embedded(template_of(rendered), step)
    if job["kind"] == "TFJob":
        return [spec["template"] for spec in job["spec"]["tfReplicaSpecs"].values()]
    return cluster_actors.jobset_pods(trainer_jobset(rendered, step))




def closure(rendered: render.Rendered, name: str) -> set[str]:
    """Every resource `name` waits for, directly or through others."""
    by_name = {r.name: r for r in rendered.resources}
    seen, todo = set(), [name]
    while todo:
        for dependency in by_name[todo.pop()].depends_on - seen:
            seen.add(dependency)
            todo.append(dependency)
    return seen
