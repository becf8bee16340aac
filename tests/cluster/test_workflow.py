"""The workflow on Argo's real controller, and the workflow's rights asked of the real authorizer."""

from __future__ import annotations

import re

from stack_checks import WORKFLOW_ACCOUNT
from tier_helpers import NAMESPACE

from common import cluster_names
from engines import DEFAULT_ENGINE, ENGINES
from infra.pipeline import EXECUTOR_RULE
from pipeline import argo

SUBJECT = f"system:serviceaccount:{NAMESPACE}:{WORKFLOW_ACCOUNT}"
STARTED_SECONDS = 90


def test_a_workflow_submitted_from_the_template_runs_its_first_step_as_the_workflows_account(
    tier, local_stack_objects
):
    """Argo's controller accepts the WorkflowTemplate the stack installs: a Workflow that names it is
    validated and its first step (ingest, memoized) gets a pod under the workflow's service account,
    its memo cache in Argo's namespace."""
    workflow = argo.workflow()  # `kubectl create -f` of what `pipeline render` writes
    metadata = {**workflow["metadata"], "namespace": NAMESPACE}
    created = tier.api.create({**workflow, "metadata": metadata})
    name = created["metadata"]["name"]

    def first_pod():
        current = tier.api.get(argo.API_VERSION, "Workflow", name, NAMESPACE)
        assert (current.get("status") or {}).get("phase") in (None, "Pending", "Running"), current
        return tier.api.list("v1", "Pod", NAMESPACE, label_selector=f"workflows.argoproj.io/workflow={name}")

    (pod,) = tier.api.wait(first_pod, "the workflow's first pod", STARTED_SECONDS)
    assert pod["spec"]["serviceAccountName"] == WORKFLOW_ACCOUNT
    # `<workflow>.ingest`: the step itself, not a try of a retryStrategy (ingest, memoized, has none)
    assert re.fullmatch(rf"{name}\.ingest", pod["metadata"]["annotations"]["workflows.argoproj.io/node-name"])
    cache = tier.api.get("v1", "ConfigMap", argo.MEMO_CACHE_NAME, argo.ARGO_NAMESPACE)
    assert cache["metadata"]["labels"][argo.MEMO_CACHE_LABEL] == "Cache"
    tier.api.delete(argo.API_VERSION, "Workflow", name, NAMESPACE)


def rules_of(review: dict) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in review["status"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_workflows_account_may_make_every_call_its_steps_make_and_nothing_else(tier, local_stack_objects):
    """Asked of the real authorizer (RBAC): every call of the train and serve steps is allowed for the
    workflow's service account; what its rules allow in its namespace is exactly those calls, the
    executor's, and what every authenticated user may do."""
    for group, resource, verb in {*cluster_names.API_CALLS, *ENGINES[DEFAULT_ENGINE].step_calls}:
        main, _, sub = resource.partition("/")
        review = tier.api.create(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": SUBJECT,
                    "groups": [
                        "system:serviceaccounts",
                        f"system:serviceaccounts:{NAMESPACE}",
                        "system:authenticated",
                    ],
                    "resourceAttributes": {
                        "namespace": NAMESPACE,
                        "group": group,
                        "resource": main,
                        "subresource": sub,
                        "verb": verb,
                    },
                },
            }
        )
        assert review["status"]["allowed"], (group, resource, verb, review["status"])
    workflow = tier.kubeconfig_for(NAMESPACE, WORKFLOW_ACCOUNT, "workflow-rules")
    as_workflow = type(tier.api)(workflow)
    mine = rules_of(
        as_workflow.create(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": NAMESPACE},
            }
        )
    )
    nobody = tier.kubeconfig_for("default", "default", "anybody")
    everyone = rules_of(
        type(tier.api)(nobody).create(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": NAMESPACE},
            }
        )
    )
    executor = {
        (group, resource, verb)
        for group in EXECUTOR_RULE["apiGroups"]
        for resource in EXECUTOR_RULE["resources"]
        for verb in EXECUTOR_RULE["verbs"]
    }
    expected = {*cluster_names.API_CALLS, *ENGINES[DEFAULT_ENGINE].step_calls, *executor}
    assert mine - everyone == expected
