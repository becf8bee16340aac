"""TF_CONFIG: the cluster description MultiWorkerMirroredStrategy and ParameterServerStrategy read,
from whichever engine started this process, checked before TensorFlow starts.

- A TFJob's pods get TF_CONFIG from the training operator (kubeflow/trainer v1.9.4).
- A TrainJob's pods (Kubeflow Trainer v2, on JobSet) get none: Trainer v2 sets no TF_CONFIG. Our
  ClusterTrainingRuntime gives each pod what a JobSet pod knows (JOBSET_ENV, below: its JobSet's name
  and replicated job, its completion index, the node count, the port), and `tf_config_of` builds
  TF_CONFIG from it, naming every task by JobSet's stable hostname `<jobset>-<job>-0-<i>.<jobset>`.
- Local processes (trainer.launch) get that same environment, plus where each of those hostnames
  listens on this machine, so they run the code path TrainJob pods run.

A malformed or inconsistent environment is a ClusterConfigError naming what is wrong, never a hang.
`cluster_from_environment` also tells whether this process is the chief (the one that writes) and which
strategy the cluster is for (a `ps` task type means parameter servers).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from typing import Callable, Mapping

from common.cli import UsageError
from common.ports import LOOPBACK, free_ports

TF_CONFIG = "TF_CONFIG"
CHIEF, WORKER, PS = "chief", "worker", "ps"
WORKER_TYPES = (CHIEF, WORKER)
TASK_TYPES = (CHIEF, WORKER, PS)
RPC_LAYER = "grpc"  # what TFJob's TF_CONFIG implies (it names no rpc_layer), and ours

# The replicated jobs of our TensorFlow runtime: `node` is Trainer v2's (the TrainJob fills its
# container `node` and sets its pod count, numNodes); `ps` holds the parameter servers, if any.
NODE_JOB, PS_JOB = "node", "ps"
# What a pod of our TrainJob knows, as environment variables (engines/trainjob.py declares them in the
# runtime; Kubernetes sets JOB_COMPLETION_INDEX in every pod of an Indexed Job, as JobSet's are):
JOBSET_NAME_ENV = "DIST_ML_JOBSET"  # the JobSet's name, the TrainJob's (label jobset.sigs.k8s.io/jobset-name)
REPLICATED_JOB_ENV = "DIST_ML_REPLICATED_JOB"  # node or ps (label jobset.sigs.k8s.io/replicatedjob-name)
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"  # this pod's index in its replicated job
NUM_NODES_ENV = "DIST_ML_NUM_NODES"  # the TrainJob's numNodes: the node job's pods
PARAMETER_SERVERS_ENV = "DIST_ML_PARAMETER_SERVERS"  # the ps job's pods; 0 or unset: synchronous
PORT_ENV = "DIST_ML_TF_PORT"  # every task's port (the runtime's named container port)
TF_PORT = 2222  # the port our runtime's pods listen on (TFJob's default port too)
TF_PORT_NAME = "tf"  # the named container port
# Local processes only: JSON {hostname: "127.0.0.1:port"}, where each task's hostname listens here.
LOCAL_ADDRESSES_ENV = "DIST_ML_LOCAL_ADDRESSES"
JOBSET_ENV = (JOBSET_NAME_ENV, REPLICATED_JOB_ENV, COMPLETION_INDEX_ENV, NUM_NODES_ENV, PORT_ENV)
# Every variable that describes a process's cluster, whichever engine set it.
CLUSTER_ENV = (TF_CONFIG, *JOBSET_ENV, PARAMETER_SERVERS_ENV, LOCAL_ADDRESSES_ENV)


class ClusterConfigError(UsageError, ValueError):
    """TF_CONFIG, or the environment it is built from, is malformed, or names hosts that never resolve;
    the message says what is wrong. A user's mistake (exit status 2): restarting the pod changes
    nothing, so JobSet's usage-error rule fails the set at once."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    cluster: dict[str, list[str]]
    task_type: str
    task_index: int

    @property
    def uses_parameter_servers(self) -> bool:
        return PS in self.cluster

    @property
    def num_workers(self) -> int:
        """The processes that compute training steps. Under parameter servers the chief only
        coordinates: it schedules steps on the workers."""
        if self.uses_parameter_servers:
            return len(self.cluster[WORKER])
        return sum(len(self.cluster.get(kind, [])) for kind in WORKER_TYPES)

    @property
    def num_parameter_servers(self) -> int:
        return len(self.cluster.get(PS, []))

    @property
    def is_chief(self) -> bool:
        """The chief task if there is one, else worker 0: the convention of TF and TFJob."""
        if CHIEF in self.cluster:
            return self.task_type == CHIEF
        return self.task_type == WORKER and self.task_index == 0


LOCAL = ClusterSpec(cluster={WORKER: ["localhost:0"]}, task_type=WORKER, task_index=0)


def _fail(problem: str) -> ClusterConfigError:
    return ClusterConfigError(f"malformed {TF_CONFIG}: {problem}")


def parse_tf_config(text: str | None) -> ClusterSpec:
    """The cluster of TF_CONFIG; no TF_CONFIG (None or empty) means one local worker."""
    if not text:
        return LOCAL
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(f"not JSON ({error})") from None
    if not isinstance(config, dict):
        raise _fail("not a JSON object")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise _fail("'cluster' must be an object of task type to address list")
    unsupported = sorted(set(cluster) - set(TASK_TYPES))
    if unsupported:
        raise _fail(f"task types {unsupported} are not supported; use {', '.join(TASK_TYPES)}")
    if PS in cluster and not (CHIEF in cluster and WORKER in cluster):
        # ParameterServerStrategy's coordinator is the chief, and it schedules steps on workers.
        raise _fail(f"a cluster with {PS} tasks needs a {CHIEF} and {WORKER} tasks")
    for kind, addresses in cluster.items():
        if (not isinstance(addresses, list) or not addresses
                or not all(isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses)):
            raise _fail(f"cluster.{kind} must be a non-empty list of 'host:port' strings")
    if not isinstance(task, dict):
        raise _fail("'task' must be an object with 'type' and 'index'")
    task_type, task_index = task.get("type"), task.get("index")
    if task_type not in cluster:
        raise _fail(f"task.type {task_type!r} is not one of the cluster's {sorted(cluster)}")
    if not isinstance(task_index, int) or not 0 <= task_index < len(cluster[task_type]):
        raise _fail(f"task.index {task_index!r} is not in 0..{len(cluster[task_type]) - 1}")
    return ClusterSpec(cluster=cluster, task_type=task_type, task_index=task_index)


# --- TF_CONFIG from what a JobSet pod knows -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JobSetPod:
    """One pod of our TrainJob's JobSet, as its environment describes it.

    Synchronous: the `nodes` pods of job `node` are the workers. Under parameter servers, node 0 is the
    chief (the coordinator), nodes 1.. are the workers, and job `ps` holds `parameter_servers` pods.
    """
    jobset: str
    replicated_job: str
    index: int
    nodes: int
    parameter_servers: int
    port: int
    # Local processes only: hostname -> "127.0.0.1:port"; on a cluster, JobSet's DNS resolves them.
    local_addresses: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def address(self, replicated_job: str, index: int) -> str:
        host = jobset_hostname(self.jobset, replicated_job, index)
        if self.local_addresses:
            try:
                return self.local_addresses[host]
            except KeyError:
                raise _env_fail(LOCAL_ADDRESSES_ENV, f"has no address for {host}") from None
        return f"{host}:{self.port}"

    def cluster(self) -> dict[str, list[str]]:
        nodes = [self.address(NODE_JOB, index) for index in range(self.nodes)]
        if not self.parameter_servers:
            return {WORKER: nodes}
        return {CHIEF: nodes[:1], WORKER: nodes[1:],
                PS: [self.address(PS_JOB, index) for index in range(self.parameter_servers)]}

    def task(self) -> dict:
        if self.replicated_job == PS_JOB:
            return {"type": PS, "index": self.index}
        if not self.parameter_servers:
            return {"type": WORKER, "index": self.index}
        return {"type": CHIEF, "index": 0} if self.index == 0 else {"type": WORKER, "index": self.index - 1}


def jobset_replicas(workers: int, parameter_servers: int = 0) -> dict[str, int]:
    """The pods of each replicated job of our runtime: the workers in `node`; under parameter servers
    the chief too (node 0), and the parameter servers in `ps`."""
    if not parameter_servers:
        return {NODE_JOB: workers}
    return {NODE_JOB: workers + 1, PS_JOB: parameter_servers}


def jobset_hostname(jobset: str, replicated_job: str, index: int) -> str:
    """JobSet's stable DNS name of pod `index` of a replicated job's (only) Job, in the headless Service
    JobSet names after the JobSet (jobset v0.12.0: network.enableDNSHostnames, subdomain defaults)."""
    return f"{jobset}-{replicated_job}-0-{index}.{jobset}"


def tf_config_of(pod: JobSetPod) -> str:
    """The TF_CONFIG of one pod: the same cluster for every pod of the JobSet, its own task."""
    return json.dumps({"cluster": pod.cluster(), "task": pod.task()})


def _env_fail(name: str, problem: str) -> ClusterConfigError:
    return ClusterConfigError(f"malformed TrainJob pod environment: {name} {problem}")


def _whole_number(env: Mapping[str, str], name: str, least: int, default: str = "") -> int:
    text = env.get(name, default)
    try:
        value = int(text)
    except ValueError:
        raise _env_fail(name, f"must be a whole number, got {text!r}") from None
    if value < least:
        raise _env_fail(name, f"must be >= {least}, got {value}")
    return value


def jobset_pod(env: Mapping[str, str]) -> JobSetPod:
    """This pod, from JOBSET_ENV (and LOCAL_ADDRESSES_ENV locally); any of it missing or inconsistent
    is a ClusterConfigError naming the variable."""
    missing = [name for name in JOBSET_ENV if not env.get(name)]
    if missing:
        raise _env_fail(", ".join(missing), f"unset (a TrainJob pod needs all of {', '.join(JOBSET_ENV)})")
    replicated_job = env[REPLICATED_JOB_ENV]
    parameter_servers = _whole_number(env, PARAMETER_SERVERS_ENV, 0, default="0")  # unset: synchronous
    nodes = _whole_number(env, NUM_NODES_ENV, 2 if parameter_servers else 1)
    if replicated_job not in (NODE_JOB, PS_JOB) or (replicated_job == PS_JOB and not parameter_servers):
        jobs = (f"{NODE_JOB} or {PS_JOB}" if parameter_servers
                else f"{NODE_JOB} ({PARAMETER_SERVERS_ENV} is 0)")
        raise _env_fail(REPLICATED_JOB_ENV, f"must be {jobs}, got {replicated_job!r}")
    index = _whole_number(env, COMPLETION_INDEX_ENV, 0)
    count = nodes if replicated_job == NODE_JOB else parameter_servers
    if index >= count:
        raise _env_fail(COMPLETION_INDEX_ENV, f"{index} is not in 0..{count - 1} (the {replicated_job} "
                                              f"job's pods)")
    port = _whole_number(env, PORT_ENV, 1)
    if port > 65535:
        raise _env_fail(PORT_ENV, f"must be a TCP port, got {port}")
    return JobSetPod(env[JOBSET_NAME_ENV], replicated_job, index, nodes, parameter_servers, port,
                     _local_addresses(env.get(LOCAL_ADDRESSES_ENV)))


def _local_addresses(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        addresses = json.loads(text)
    except json.JSONDecodeError as error:
        raise _env_fail(LOCAL_ADDRESSES_ENV, f"is not JSON ({error})") from None
    if not isinstance(addresses, dict) or not all(isinstance(v, str) for v in addresses.values()):
        raise _env_fail(LOCAL_ADDRESSES_ENV, "must be an object of hostname to 'host:port'")
    return addresses


def cluster_from_environment(env: Mapping[str, str]) -> ClusterSpec:
    """The cluster this process belongs to: TF_CONFIG when an engine set it (a TFJob), else the one
    built from a TrainJob pod's environment, else one local worker."""
    if env.get(TF_CONFIG):
        return parse_tf_config(env[TF_CONFIG])
    if any(env.get(name) for name in (JOBSET_NAME_ENV, REPLICATED_JOB_ENV, NUM_NODES_ENV)):
        return parse_tf_config(tf_config_of(jobset_pod(env)))
    return LOCAL


# A pod's own name resolves seconds after it starts (it has its address, and JobSet's headless Service
# publishes not-ready addresses); one still unknown after this never will: a subdomain that is not the
# Service's. (A peer's may lag while its node is made: that is TensorFlow's to wait for.)
OWN_HOST_RESOLVES_SECONDS = 60.0
HOSTS_POLL_SECONDS = 2.0


def resolve_host(host: str) -> None:
    socket.getaddrinfo(host.strip("[]"), None)  # an IPv6 address is bracketed before its port


def wait_for_own_host(cluster: ClusterSpec, timeout: float = OWN_HOST_RESOLVES_SECONDS,
                      resolve: Callable[[str], None] = resolve_host,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """Waits until this task's own host (as the cluster names it) resolves; ClusterConfigError naming it
    after `timeout` s (without this check, TensorFlow's collectives wait for it for ever)."""
    host = cluster.cluster[cluster.task_type][cluster.task_index].rpartition(":")[0]
    deadline = clock() + timeout
    while True:
        try:
            resolve(host)
            return
        except OSError as error:
            if clock() >= deadline:
                raise ClusterConfigError(
                    f"this pod's own host {host} does not resolve after {timeout:g} s ({error}): is the "
                    "pods' subdomain the headless Service their names are built on?") from None
        sleep(HOSTS_POLL_SECONDS)


# --- The same environment for local processes -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LocalTask:
    """One local process of a job: its TensorFlow task, and the environment a TrainJob pod gets."""
    task_type: str
    index: int
    env: dict[str, str]


LOCAL_JOBSET = "local"  # the JobSet name local processes pretend to belong to


def local_tasks(num_workers: int, parameter_servers: int = 0, jobset: str = LOCAL_JOBSET) -> list[LocalTask]:
    """The processes of one job on 127.0.0.1, each with a TrainJob pod's environment and every task's
    hostname on its own free port: `num_workers` workers, or under parameter servers a chief, the
    workers and the parameter servers (the chief first)."""
    replicas = jobset_replicas(num_workers, parameter_servers)
    hosts = [jobset_hostname(jobset, job, index) for job, count in replicas.items() for index in range(count)]
    addresses = json.dumps({host: f"{LOOPBACK}:{port}" for host, port in zip(hosts, free_ports(len(hosts)))})
    tasks = []
    for job, count in replicas.items():
        for index in range(count):
            env = {JOBSET_NAME_ENV: jobset, REPLICATED_JOB_ENV: job, COMPLETION_INDEX_ENV: str(index),
                   NUM_NODES_ENV: str(replicas[NODE_JOB]), PARAMETER_SERVERS_ENV: str(parameter_servers),
                   PORT_ENV: str(TF_PORT), LOCAL_ADDRESSES_ENV: addresses}
            task = jobset_pod(env).task()
            tasks.append(LocalTask(task["type"], task["index"], env))
    return tasks
