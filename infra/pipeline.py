"""The pipeline on the cluster: its WorkflowTemplate (rendered by pipeline.argo), the training runtimes
its TrainJobs name (cluster-scoped), the memo cache in Argo's namespace with the controller's right
to write it, one service account for the workflow's pods (allowed exactly what they do) and one for
the training pods (allowed nothing), and optionally a Workflow that runs it once."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_names import API_CALLS
from common.cluster_target import TRAINER_SERVICE_ACCOUNT, ClusterTarget
from engines import ENGINES
from engines.base import TrainingEngine
from infra.accounts import bound_role, service_account
from infra.awaits import SKIP_AWAIT
from pipeline import argo
from pipeline.config import PipelineConfig

EXECUTOR_RULE = {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
                 "verbs": ["create", "patch"]}


def workflow_pod_rules(engine: TrainingEngine) -> list[dict]:
    """What the workflow's pods do with their service account, and nothing more: Argo's emissary
    executor reports results; train steps make their engine's calls (create, watch and, when giving up
    or retrying, delete its jobs, read their pods, and what else the engine reads); the serve step
    creates or replaces the InferenceService and reads its Deployment and pods to see the rollout."""
    calls = sorted(set(engine.step_calls) | set(API_CALLS))
    return [EXECUTOR_RULE, *({"apiGroups": [group], "resources": [resource], "verbs": [verb]}
                             for group, resource, verb in calls)]

MEMO_CACHE_RULES = [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [argo.MEMO_CACHE_NAME],
                     "verbs": ["get", "update"]},
                    # create cannot be limited to a name: the name is not known before the object exists.
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]


@dataclasses.dataclass(frozen=True)
class PipelineArgs:
    config: PipelineConfig
    target: pulumi.Input[ClusterTarget]  # an Output where images are known only after a push
    namespace: str
    run_on_up: bool
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # the platform's CRDs, the images, the storage
    service_account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)
    # The system's namespace: `pulumi destroy` deletes these with it (deleted_with), see stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


def custom_resource(name: str, api_version: str, kind: str, manifest: pulumi.Output[dict],
                    namespace: str | None, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """A typed CustomResource of a rendered manifest (an Output, as the images may be), in `namespace`
    (None: cluster-scoped). Its kind and API version are plain strings: they make the resource's type."""
    metadata = manifest["metadata"]
    if namespace is not None:
        metadata = metadata.apply(lambda metadata: {**metadata, "namespace": namespace})
    return k8s.apiextensions.CustomResource(name, api_version=api_version, kind=kind, metadata=metadata,
                                            spec=manifest["spec"], opts=opts)


class PipelineResources(pulumi.ComponentResource):
    workflow_template: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: PipelineArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Pipeline", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        with_namespace = pulumi.ResourceOptions(deleted_with=args.deleted_with)
        in_namespace = pulumi.ResourceOptions.merge(on_cluster, with_namespace)
        workflow_account = args.config.service_account_name
        identities = [
            service_account(f"{name}-service-account", workflow_account, args.namespace,
                            args.service_account_annotations, in_namespace),
            bound_role(name, workflow_account, args.namespace,
                       workflow_pod_rules(ENGINES[args.config.engine]),
                       args.namespace, workflow_account, in_namespace),
            # Training pods read and write storage and call no Kubernetes API.
            service_account(f"{name}-trainer-service-account", TRAINER_SERVICE_ACCOUNT, args.namespace,
                            args.service_account_annotations, in_namespace),
        ]

        cache = argo.memo_cache()
        memo_cache = k8s.core.v1.ConfigMap(f"{name}-memoize-cache", metadata=cache["metadata"],
                                           opts=on_cluster)
        cache_writer = bound_role(
            f"{name}-memoize-cache", argo.MEMO_CACHE_NAME, argo.ARGO_NAMESPACE, MEMO_CACHE_RULES,
            argo.ARGO_NAMESPACE, argo.ARGO_CONTROLLER_ACCOUNT, on_cluster)

        objects = pulumi.Output.from_input(args.target).apply(
            lambda target: argo.render_objects(args.config, target))
        needs = pulumi.ResourceOptions(parent=self, provider=args.provider,
                                       depends_on=[*args.depends_on, *identities, memo_cache, cache_writer])
        # Before the template: a TrainJob naming a runtime that is not there is refused (by Trainer's
        # webhook and Kueue's).
        # Their names and kinds do not depend on the cluster target (only their images and storage do).
        runtimes = [custom_resource(f"{name}-{runtime['metadata']['name']}", runtime["apiVersion"],
                                    runtime["kind"], objects[argo.runtime_file(runtime)], None, needs)
                    for runtime in argo.training_runtimes(args.config, ClusterTarget())]
        needs = pulumi.ResourceOptions.merge(needs, pulumi.ResourceOptions(depends_on=runtimes))
        in_namespace = pulumi.ResourceOptions.merge(needs, with_namespace)
        self.workflow_template = custom_resource(
            f"{name}-workflow-template", argo.API_VERSION, "WorkflowTemplate",
            objects["workflowtemplate.yaml"], args.namespace, in_namespace)
        if args.run_on_up:
            # Pulumi names it (pipeline-run-<suffix>) in place of Argo's generateName.
            run = objects["workflow.yaml"].apply(lambda workflow: {**workflow, "metadata": {
                "labels": workflow["metadata"]["labels"], "annotations": SKIP_AWAIT}})
            custom_resource(f"{name}-run", argo.API_VERSION, "Workflow", run, args.namespace,
                            pulumi.ResourceOptions.merge(
                                in_namespace, pulumi.ResourceOptions(depends_on=[self.workflow_template])))
        self.register_outputs({"workflowTemplate": self.workflow_template.metadata["name"]})
