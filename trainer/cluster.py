"""TF_CONFIG: the cluster description the training operator gives every TFJob pod, checked before
TensorFlow starts.

MultiWorkerMirroredStrategy and ParameterServerStrategy read TF_CONFIG themselves; this module checks
it first so that a malformed one is a clear error instead of a hang, tells whether this process is
the chief (the one that writes) and which strategy the cluster is for (a `ps` task type means
parameter servers), and generates one for local processes, as the TFJob controller does for pods.
"""

from __future__ import annotations

import dataclasses
import json

from common.ports import free_ports

TF_CONFIG = "TF_CONFIG"
CHIEF, WORKER, PS = "chief", "worker", "ps"
WORKER_TYPES = (CHIEF, WORKER)
TASK_TYPES = (CHIEF, WORKER, PS)


class ClusterConfigError(ValueError):
    """TF_CONFIG is malformed; the message says what is wrong."""


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
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0


LOCAL = ClusterSpec(cluster={"worker": ["localhost:0"]}, task_type="worker", task_index=0)


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


@dataclasses.dataclass(frozen=True)
class LocalTask:
    task_type: str
    index: int
    tf_config: str


def local_tf_configs(num_workers: int) -> list[str]:
    """One TF_CONFIG per worker process on 127.0.0.1, as the TFJob controller writes them."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(num_workers)]
    return [
        json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        for index in range(num_workers)
    ]


def local_parameter_server_tasks(num_workers: int, num_ps: int) -> list[LocalTask]:
    """The chief, `num_workers` workers and `num_ps` parameter servers on 127.0.0.1, each with the
    TF_CONFIG the TFJob controller writes for its Chief, Worker and PS pods; the chief first."""
    ports = iter(free_ports(1 + num_workers + num_ps))
    cluster = {kind: [f"127.0.0.1:{next(ports)}" for _ in range(count)]
               for kind, count in ((CHIEF, 1), (WORKER, num_workers), (PS, num_ps))}
    return [LocalTask(kind, index, json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))
            for kind, addresses in cluster.items() for index in range(len(addresses))]
