"""The pipeline on the cluster: its WorkflowTemplate (rendered by pipeline.argo), the memo cache,
a service account allowed exactly what the steps do, and optionally a Workflow that runs it once."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from infra.awaits import SKIP_AWAIT
from pipeline import argo
from pipeline.config import PipelineConfig
from pipeline.manifests import PART_OF, ClusterTarget

ALL_VERBS_ON_OWN_OBJECTS = ["create", "get", "list", "watch", "patch", "delete"]
# What the steps' pods do: create and watch TFJobs and the InferenceService (resource templates),
# read their pods and logs, keep the memo (ConfigMaps), and report results (Argo's executor).
PIPELINE_RULES = [
    {"apiGroups": ["kubeflow.org"], "resources": ["tfjobs"], "verbs": ALL_VERBS_ON_OWN_OBJECTS},
    {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
     "verbs": ALL_VERBS_ON_OWN_OBJECTS},
    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]},
    {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
]


@dataclasses.dataclass(frozen=True)
class PipelineArgs:
    config: PipelineConfig
    target: pulumi.Input[ClusterTarget]  # an Output where images are known only after a push
    namespace: str
    run_on_up: bool
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # the platform's CRDs, the images, the storage
    service_account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)


def custom_resource(name: str, kind: str, manifest: pulumi.Output[dict], namespace: str,
                    opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """A typed CustomResource of a rendered manifest (an Output, as the images may be). Its kind
    and API version are plain strings: they make the resource's type."""
    return k8s.apiextensions.CustomResource(
        name, api_version=argo.API_VERSION, kind=kind,
        metadata=manifest["metadata"].apply(lambda metadata: {**metadata, "namespace": namespace}),
        spec=manifest["spec"], opts=opts)


class PipelineResources(pulumi.ComponentResource):
    workflow_template: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: PipelineArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Pipeline", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        account = args.config.service_account_name
        metadata = {"namespace": args.namespace, "labels": PART_OF}

        service_account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata={"name": account, **metadata, "annotations": args.service_account_annotations},
            opts=on_cluster)
        role = k8s.rbac.v1.Role(f"{name}-role", metadata={"name": account, **metadata},
                                rules=PIPELINE_RULES, opts=on_cluster)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-role-binding", metadata={"name": account, **metadata},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            subjects=[{"kind": "ServiceAccount", "name": account, "namespace": args.namespace}],
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[role]))

        objects = pulumi.Output.from_input(args.target).apply(
            lambda target: argo.render_objects(args.config, target))
        cache = argo.memo_cache()
        memo_cache = k8s.core.v1.ConfigMap(
            f"{name}-memoize-cache", metadata={**cache["metadata"], "namespace": args.namespace},
            opts=on_cluster)
        needs = pulumi.ResourceOptions(parent=self, provider=args.provider,
                                       depends_on=[*args.depends_on, service_account, binding, memo_cache])
        self.workflow_template = custom_resource(
            f"{name}-workflow-template", "WorkflowTemplate", objects["workflowtemplate.yaml"],
            args.namespace, needs)
        if args.run_on_up:
            # Pulumi names it (pipeline-run-<suffix>) in place of Argo's generateName.
            run = objects["workflow.yaml"].apply(lambda workflow: {**workflow, "metadata": {
                "labels": workflow["metadata"]["labels"], "annotations": SKIP_AWAIT}})
            custom_resource(f"{name}-run", "Workflow", run, args.namespace, pulumi.ResourceOptions.merge(
                needs, pulumi.ResourceOptions(depends_on=[self.workflow_template])))
        self.register_outputs({"workflowTemplate": self.workflow_template.metadata["name"]})
