"""The pods Trainer and JobSet make of a train step's TrainJob, restated from their code at the tags
the stacks install, for the fast checks that read every step of every stack config (their images,
accounts, requests; tests/test_cluster_contracts.py, tests/test_infra_gke.py). The control-plane tier
runs the controllers themselves on the local stack (tests/cluster/test_train.py) and on the gke
stack's pools (tests/cluster/test_gke_placement.py: Kueue's flavor, tolerations, GPUs), so nothing
here restates Kueue:

- Kubeflow Trainer v2.3.0 builds the JobSet from the runtime: the replicated job labelled
  trainjob-ancestor-step=trainer gets the TrainJob's image, command, args and env in its container
  `node`, its resourcesPerNode merged in, and numNodes as parallelism and completions; every other job
  keeps the runtime's pods (pkg/runtime/framework/plugins/jobset/builder.go, plainml/plainml.go,
  core/trainingruntime.go).
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
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


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


def trainer_jobset(runtime: dict, trainjob: dict, namespace: str) -> dict:
    """The JobSet Trainer v2.3.0 creates for `trainjob` (created in `namespace`) on `runtime`, as JobSet's
    webhook defaults it."""
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
    spec.setdefault("network", {}).setdefault("enableDNSHostnames", True)
    spec["network"].setdefault("publishNotReadyAddresses", True)
    spec.setdefault("successPolicy", {"operator": "All"})
    spec["suspend"] = trainjob["spec"].get("suspend", False)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": trainjob["metadata"]["name"], "namespace": namespace}, "spec": spec}


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
