"""What the cluster's controllers make of a TrainJob and our training runtime, restated from their code
at the tags the stacks install, for the one thing the control-plane tier (tests/cluster/, which runs
these controllers) does not: the gke stack's training pods on its pools (the flavor's placement, the
GPUs), checked by tests/test_cluster_contracts.py and tests/test_infra_gke.py:

- Kueue v0.19.2's webhook suspends a TrainJob that names a queue and appends its own runtime patch
  (pkg/controller/jobs/trainjob/trainjob_webhook.go Default); at admission it writes the flavor's node
  labels and tolerations into that patch for every pod set, one per replicated job, and resumes the
  job (trainjob_controller.go RunWithPodSetsInfo, pkg/podset/podset.go).
- Kubeflow Trainer v2.3.0 builds the JobSet from the runtime: the replicated job labelled
  trainjob-ancestor-step=trainer gets the TrainJob's image, command, args and env in its container
  `node`, its resourcesPerNode merged in, and numNodes as parallelism and completions; every other job
  keeps the runtime's pods (pkg/runtime/framework/plugins/jobset/builder.go, plainml/plainml.go,
  core/trainingruntime.go); the runtime patches are merged in order, a toleration list replacing the
  runtime's (PodSpec.tolerations has no patch strategy).
- JobSet v0.12.0's webhook defaults Indexed completion, restartPolicy OnFailure and DNS hostnames
  (pkg/webhooks/jobset_webhook.go); each pod `<jobset>-<job>-<jobIndex>-<podIndex>` resolves under the
  headless Service named after the JobSet (jobset_controller.go), labelled and annotated with its
  JobSet, replicated job and index; Kubernetes' Indexed Job annotates each pod with its completion
  index.
"""

from __future__ import annotations

import copy

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE_CONTAINER = "node"
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def kueue_created(trainjob: dict) -> dict:
    """The TrainJob as Kueue's mutating webhook lets it in: suspended when it names a queue, with an
    empty runtime patch of Kueue's own."""
    created = copy.deepcopy(trainjob)
    if QUEUE_LABEL in created["metadata"].get("labels", {}):
        created["spec"]["suspend"] = True
    created["spec"].setdefault("runtimePatches", []).append(
        {"manager": KUEUE_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}})
    return created


def kueue_admitted(trainjob: dict, runtime: dict, flavor: dict) -> dict:
    """The TrainJob once Kueue admitted it on `flavor` (a ResourceFlavor): every replicated job's pods
    get the flavor's node labels as nodeSelector and its tolerations, through Kueue's runtime patch."""
    admitted = copy.deepcopy(trainjob)
    (patch,) = [p for p in admitted["spec"]["runtimePatches"] if p["manager"] == KUEUE_MANAGER]
    placement = {}
    if flavor["spec"].get("nodeLabels"):
        placement["nodeSelector"] = dict(flavor["spec"]["nodeLabels"])
    if flavor["spec"].get("tolerations"):
        placement["tolerations"] = copy.deepcopy(flavor["spec"]["tolerations"])
    patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = [
        {"name": job["name"], "template": {"spec": {"template": {
            "metadata": {"labels": {"kueue.x-k8s.io/podset": job["name"]}}, "spec": placement}}}}
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    admitted["spec"]["suspend"] = False
    return admitted


def _upsert(items: list[dict], new: list[dict]) -> list[dict]:
    """Kubernetes' merge of lists keyed by name (containers, env)."""
    by_name = {item["name"]: item for item in items}
    merged = [dict(item) for item in items]
    for item in new:
        if item["name"] in by_name:
            merged[[m["name"] for m in merged].index(item["name"])].update(item)
        else:
            merged.append(dict(item))
    return merged


def _patch_pod(pod: dict, patch: dict) -> None:
    metadata = patch.get("metadata", {})
    for field in ("labels", "annotations"):
        if metadata.get(field):
            pod.setdefault("metadata", {}).setdefault(field, {}).update(metadata[field])
    spec = patch.get("spec", {})
    if spec.get("nodeSelector"):
        pod["spec"].setdefault("nodeSelector", {}).update(spec["nodeSelector"])
    if "tolerations" in spec:
        pod["spec"]["tolerations"] = copy.deepcopy(spec["tolerations"])  # no patch strategy: replaced
    for container in spec.get("containers", []):
        (found,) = [c for c in pod["spec"]["containers"] if c["name"] == container["name"]]
        if container.get("env"):
            found["env"] = _upsert(found.get("env", []), container["env"])


def trainer_jobset(runtime: dict, trainjob: dict) -> dict:
    """The JobSet Trainer v2.3.0 creates for `trainjob` on `runtime`, as JobSet's webhook defaults it."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    trainer = trainjob["spec"].get("trainer", {})
    nodes = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
    for job in spec["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        if job["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) == "trainer":
            (node,) = [c for c in job_spec["template"]["spec"]["containers"] if c["name"] == NODE_CONTAINER]
            for field in ("image", "command", "args"):
                if field in trainer:
                    node[field] = copy.deepcopy(trainer[field])
            node["env"] = _upsert(node.get("env", []), trainer.get("env", []))
            for kind, amounts in trainer.get("resourcesPerNode", {}).items():
                node.setdefault("resources", {}).setdefault(kind, {}).update(amounts)
            job["replicas"] = 1
            job_spec["parallelism"] = job_spec["completions"] = nodes
        else:
            job_spec["parallelism"] = job_spec["completions"] = max(job_spec.get("parallelism", 1), 1)
        job_spec.setdefault("completionMode", "Indexed")
        job_spec["template"]["spec"].setdefault("restartPolicy", "OnFailure")
        job.setdefault("replicas", 1)
    for patch in trainjob["spec"].get("runtimePatches", []):
        for job_patch in patch["trainingRuntimeSpec"]["template"]["spec"].get("replicatedJobs", []):
            (job,) = [j for j in spec["replicatedJobs"] if j["name"] == job_patch["name"]]
            _patch_pod(job["template"]["spec"]["template"], job_patch["template"]["spec"]["template"])
    spec.setdefault("network", {}).setdefault("enableDNSHostnames", True)
    spec["network"].setdefault("publishNotReadyAddresses", True)
    spec.setdefault("successPolicy", {"operator": "All"})
    spec["suspend"] = trainjob["spec"].get("suspend", False)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": trainjob["metadata"]["name"], "namespace": "dist-ml"}, "spec": spec}


def jobset_pods(jobset: dict) -> list[dict]:
    """Every pod of the JobSet: its metadata as JobSet and the Job controller set it, its hostname and
    subdomain, and its pod spec."""
    name = jobset["metadata"]["name"]
    subdomain = jobset["spec"]["network"].get("subdomain", name)
    pods = []
    for job in jobset["spec"]["replicatedJobs"]:
        template = job["template"]["spec"]["template"]
        for job_index in range(job["replicas"]):
            for index in range(job["template"]["spec"]["completions"]):
                pod = copy.deepcopy(template)
                pod.setdefault("metadata", {}).setdefault("labels", {}).update({
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                    "jobset.sigs.k8s.io/job-index": str(job_index)})
                pod["metadata"].setdefault("annotations", {})[COMPLETION_INDEX] = str(index)
                pod["spec"]["hostname"] = f"{name}-{job['name']}-{job_index}-{index}"
                pod["spec"]["subdomain"] = subdomain
                pods.append(pod)
    return pods
