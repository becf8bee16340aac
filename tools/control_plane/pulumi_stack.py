"""`pulumi up`, for real, in the end-to-end tier: Pulumi's engine and its Kubernetes provider, built from
their Go modules (tools/control_plane/components.py), run through Python's Automation API with the
stacks' own program inline (stacks.program.main, as Pulumi.yaml's `main: stacks/` runs it) and a stack
config file written as a user writes one, against the tier's API server.

The state is a file backend and the secrets a passphrase's, both under the tier's directory. No plugin
is ever downloaded (PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION: a missing one fails at once, naming
it) and the engine asks nothing of the internet (PULUMI_SKIP_UPDATE_CHECK). The provider is installed
as the plugin version the Python SDK asks for (`pulumi plugin install --file`); where that version is a
substitute (components.SUBSTITUTES), the engine's warning that the plugin reports another version is
expected, and the tier's start line says why.

While an update runs, every pod is watched: a container the kubelet says will never start (an image no
registry has, a config it cannot make) interrupts the engine at once, and the update fails in the
kubelet's words rather than at the provider's ten-minute await.
"""

from __future__ import annotations

import dataclasses
import datetime
import resource as rusage
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
import yaml
from pulumi import automation as auto

from stacks.program import main as stack_program
from stacks.settings import PROJECT
from tools.control_plane.kube import Api
from tools.control_plane.nodes.real import never_starts

STACK = "tier"
PASSPHRASE = "dist-ml-tier-throwaway"  # the state lives and dies with the tier: nothing to protect
# Resource operations at once. The engine's default is 4 per core (8 here), and the provider's steps
# mostly wait on the cluster (a Deployment's rollout, a namespace's deletion): 250 objects 8 at a time
# made `pulumi destroy` take minutes (docs/results). PULUMI_PARALLEL sets it for a user's CLI too.
PARALLEL = 64
# The provider's client of the API server: 50 requests a second by default, and every step after a change
# of the served kinds rediscovers the API's groups (about 40 here): about one step a second, whatever
# PARALLEL says (measured: deletes ending a second apart). PULUMI_K8S_CLIENT_QPS and _BURST set them.
CLIENT_QPS, CLIENT_BURST = 1000, 2000
# The file backend writes the whole state after every step: 26 MB here (Argo's and KServe's CRDs are
# megabytes each), twice (a backup), 250 times an update, which cost the engine most of its CPU time.
# The tier's state lives and dies with it: the final state alone is saved (PULUMI_SKIP_CHECKPOINTS).
SKIP_CHECKPOINTS = "true"
WATCH_SECONDS = 2.0
# After an interruption the engine cancels what is in flight; a second one ends it at once.
CANCEL_SECONDS = 60.0
CHANGES = ("create", "update", "delete", "replace", "create-replacement", "delete-replaced")


class NeverStarts(RuntimeError):
    """The kubelet said a container of the update's will never start; the message is its words."""


class KubeletWatch(threading.Thread):
    """Watches the pods an update makes; interrupts the engine (`pulumi`, a child of this process) the
    first time the kubelet says a container of one will never start."""

    def __init__(self, api: Api, engine: str):
        super().__init__(name="kubelet watch", daemon=True)
        self.api, self.engine = api, engine
        self.said: list[str] = []
        self.done = threading.Event()
        # The API server's creation times are whole seconds.
        self.since = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)

    def run(self) -> None:
        while not self.done.wait(WATCH_SECONDS):
            try:
                found = never_starts(self.api, since=self.since)
            except Exception:  # noqa: BLE001 - a read that failed: the next one goes on
                continue
            if found:
                self.said = found
                self.interrupt()
                return

    def engines(self) -> list[psutil.Process]:
        return [child for child in psutil.Process().children() if child.name() == Path(self.engine).name]

    def interrupt(self) -> None:
        for engine in self.engines():
            engine.send_signal(signal.SIGINT)
        deadline = time.monotonic() + CANCEL_SECONDS
        while self.engines() and time.monotonic() < deadline:
            time.sleep(1)
        for engine in self.engines():
            engine.send_signal(signal.SIGINT)

    def __enter__(self) -> KubeletWatch:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join(timeout=CANCEL_SECONDS * 2)


SLOWEST = 8  # resources named in an update's line
# Components last as long as their slowest child: not steps of their own.
COMPONENT_PREFIXES = ("pulumi:pulumi:Stack", "dist-ml:", "kubernetes:helm.sh/v4:Chart",
                      "kubernetes:kustomize/v2:Directory", "kubernetes:yaml/v2:ConfigFile")


class StepTimes:
    """Each resource step's seconds, from the engine's events (its start, its outputs); each step also a
    line of `log` (seconds since the first event, its op, the resource), for a look at what waited."""

    def __init__(self, log: Path) -> None:
        self.started: dict[str, int] = {}
        self.seconds: dict[str, int] = {}
        self.log, self.first = log, None

    def __call__(self, event: auto.EngineEvent) -> None:
        self.first = self.first or event.timestamp
        step = event.resource_pre_event or event.res_outputs_event or event.res_op_failed_event
        if step is not None:
            with self.log.open("a") as out:
                kind = "start" if event.resource_pre_event else "end"
                out.write(f"{event.timestamp - self.first:5d} {kind:5} {step.metadata.op.value:8} "
                          f"{step.metadata.urn.rpartition('::')[2]}\n")
        pre = event.resource_pre_event
        if pre is not None and not pre.metadata.type.startswith(COMPONENT_PREFIXES):
            self.started[pre.metadata.urn] = event.timestamp
        outputs = event.res_outputs_event or event.res_op_failed_event
        if outputs is not None and outputs.metadata.urn in self.started:
            self.seconds[outputs.metadata.urn] = event.timestamp - self.started[outputs.metadata.urn]

    def slowest(self) -> list[tuple[int, str]]:
        """(seconds, `Kind name`) of the slowest steps, slowest first."""
        ranked = sorted(self.seconds.items(), key=lambda item: -item[1])[:SLOWEST]
        return [(seconds, f"{urn.split('::')[-2].rpartition(':')[2]} {urn.rpartition('::')[2]}")
                for urn, seconds in ranked]


@dataclasses.dataclass(frozen=True)
class Update:
    """What one operation did: the engine's summary of its changes, how long it took, its slowest steps."""

    kind: str  # up, preview, destroy
    changes: dict[str, int]
    seconds: float
    slowest: tuple[tuple[int, str], ...] = ()
    cpu_seconds: float = 0.0  # the engine's and its plugins' (the provider's)
    program_cpu_seconds: float = 0.0  # this process's: the program, run inline, and the tests' threads

    @property
    def changed(self) -> dict[str, int]:
        return {op: count for op, count in self.changes.items() if op in CHANGES and count}

    def __str__(self) -> str:
        counts = ", ".join(f"{count} {op}" for op, count in sorted(self.changes.items()))
        slowest = "; slowest: " + ", ".join(f"{name} {seconds} s" for seconds, name in self.slowest)
        return (f"pulumi {self.kind}: {counts or 'nothing'} in {self.seconds:.0f} s "
                f"({self.cpu_seconds:.0f} CPU-s; this process {self.program_cpu_seconds:.0f})"
                + (slowest if self.slowest else ""))


class Clock:
    """An operation's wall time, the CPU time of the processes it ran (the engine, which waits for its
    plugins, so theirs is in its own), from this process's ended children, and this process's own."""

    def __init__(self) -> None:
        self.started, self.cpu, self.program_cpu = time.monotonic(), children_cpu(), time.process_time()

    def update(self, kind: str, changes: dict | None, steps: StepTimes | None = None) -> Update:
        return Update(kind, dict(changes or {}), time.monotonic() - self.started,
                      tuple(steps.slowest()) if steps else (), children_cpu() - self.cpu,
                      time.process_time() - self.program_cpu)


def children_cpu() -> float:
    usage = rusage.getrusage(rusage.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass
class PulumiStack:
    """One stack of the project's program in the tier, its config as a stack file holds it."""

    directory: Path
    engine: str  # the pulumi executable
    provider: str  # pulumi-resource-kubernetes
    plugin_version: str  # what the Python SDK asks for (pulumi_kubernetes' pulumi-plugin.json)
    config: dict  # "dist-ml:cluster" -> its value, as Pulumi.<stack>.yaml's `config:` holds it
    api: Api  # the tier's, to watch the pods an update starts
    say: Callable[[str], None] = print
    _stack: auto.Stack | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "PULUMI_HOME": str(self.directory / "home"),
            "PULUMI_BACKEND_URL": f"file://{self.directory / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_PARALLEL": str(PARALLEL),
            "PULUMI_K8S_CLIENT_QPS": str(CLIENT_QPS),
            "PULUMI_K8S_CLIENT_BURST": str(CLIENT_BURST),
            "PULUMI_SKIP_CHECKPOINTS": SKIP_CHECKPOINTS,
            # The provider writes a kubeconfig for Helm into the temporary directory at each start
            # and never removes it (pulumi-kubernetes provider/pkg/provider/util.go
            # writeKubeconfigToFile): here, into the tier's directory, not the machine's /tmp.
            "TMPDIR": str(self.directory / "tmp"),
        }

    def command(self) -> auto.PulumiCommand:
        """The engine as the Automation API runs it: <root>/bin/pulumi."""
        root = self.directory / "engine"
        link = root / "bin" / "pulumi"
        if not link.exists():
            link.parent.mkdir(parents=True)
            link.symlink_to(self.engine)
        return auto.PulumiCommand(root=str(root))

    def stack(self, program: Callable[[], None] = stack_program) -> auto.Stack:
        """The stack, its workspace made the first time: the backend, the provider installed as a
        plugin, the stack file."""
        for own in ("state", "tmp"):
            (self.directory / own).mkdir(parents=True, exist_ok=True)
        work = self.directory / "project"
        work.mkdir(exist_ok=True)
        settings = work / f"Pulumi.{STACK}.yaml"
        if not settings.exists():  # once: the engine adds the passphrase's salt to it
            settings.write_text(yaml.safe_dump({"config": self.config}, sort_keys=False))
        command = self.command()
        if self._stack is None:
            command.run(["plugin", "install", "resource", "kubernetes", self.plugin_version, "--file",
                         self.provider], str(work), self.env)
        workspace = auto.LocalWorkspaceOptions(
            work_dir=str(work), env_vars=self.env, pulumi_command=command, secrets_provider="passphrase",
            project_settings=auto.ProjectSettings(name=PROJECT, runtime="python"))
        self._stack = auto.create_or_select_stack(STACK, project_name=PROJECT, program=program,
                                                  opts=workspace)
        return self._stack

    def step_log(self, kind: str) -> Path:
        """A new file for an operation's steps: <directory>/steps/<n>-<kind>.log."""
        directory = self.directory / "steps"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f"{len(list(directory.iterdir())) + 1}-{kind}.log"

    def version(self) -> str:
        return self.command().run(["version"], str(self.directory), self.env).stdout.strip()

    def up(self, program: Callable[[], None] = stack_program) -> Update:
        """`pulumi up`; NeverStarts, in the kubelet's words, when a container of it will never start."""
        stack, clock, steps = self.stack(program), Clock(), StepTimes(self.step_log("up"))
        started = clock.started
        with KubeletWatch(self.api, self.engine) as watch:
            try:
                result = stack.up(on_output=self._engine_line, on_event=steps, color="never")
            except auto.errors.CommandError as error:
                if watch.said:
                    seconds = time.monotonic() - started
                    raise NeverStarts(f"pulumi up interrupted after {seconds:.0f} s: "
                                      + "; ".join(watch.said)) from error
                raise
        update = clock.update("up", result.summary.resource_changes, steps)
        self.say(str(update))
        return update

    def preview(self, program: Callable[[], None] = stack_program,
                targets: list[str] | None = None) -> tuple[Update, list[str]]:
        """`pulumi preview` (of `targets` only, URNs, when given: the engine diffs nothing else): its
        summary, and each resource it would change (type, name, and the properties whose values
        differ)."""
        stack, clock = self.stack(program), Clock()
        changed: list[str] = []

        def noted(event: auto.EngineEvent) -> None:
            pre = event.resource_pre_event
            if pre is not None and pre.metadata.op.value in CHANGES:
                urn, metadata = pre.metadata.urn, pre.metadata
                paths = [*(metadata.detailed_diff or {}), *(metadata.diffs or [])]
                keys = ", ".join(dict.fromkeys(paths)) or "its inputs"
                replaces = f"; replaced for {', '.join(metadata.keys)}" if metadata.keys else ""
                changed.append(f"{metadata.op.value} {urn.split('::')[-2].rpartition('$')[2]} "
                               f"{urn.rpartition('::')[2]} ({keys}{replaces})")

        result = stack.preview(on_event=noted, color="never", diff=True, target=targets)
        update = clock.update("preview", result.change_summary)
        self.say(str(update))
        return update, changed

    def destroy(self) -> Update:
        stack, clock, steps = self.stack(), Clock(), StepTimes(self.step_log("destroy"))
        result = stack.destroy(on_output=self._engine_line, on_event=steps, color="never")
        update = clock.update("destroy", result.summary.resource_changes, steps)
        self.say(str(update))
        return update

    def resources(self) -> list[dict]:
        """The state's Kubernetes objects: their resource's URN and name, and apiVersion, kind, name and
        namespace of each."""
        deployment = self.stack().export_stack().deployment or {}
        found = []
        for resource in deployment.get("resources") or []:
            outputs = resource.get("outputs") or {}
            if resource.get("external"):
                continue  # read, not made (the cluster's Gateway API CRDs)
            if resource.get("custom") and resource["type"].startswith("kubernetes:") and "kind" in outputs:
                metadata = outputs.get("metadata") or {}
                found.append({"urn": resource["urn"], "resource": resource["urn"].rpartition("::")[2],
                              "apiVersion": outputs["apiVersion"], "kind": outputs["kind"],
                              "name": metadata.get("name"), "namespace": metadata.get("namespace")})
        return found

    def _engine_line(self, line: str) -> None:
        """The engine's diagnostics (its errors and warnings, the provider's among them), as they come."""
        if line.lstrip().startswith(("error:", "warning:", "* ")):
            self.say(f"pulumi: {line.strip()}")


def no_changes(update: Update, changed: list[str]) -> None:
    """Fails naming each resource a second look would change: a diff that never settles."""
    if update.changed or changed:
        raise AssertionError(f"a second look would change {sum(update.changed.values())} resources "
                             f"({update.changed}): " + "; ".join(changed))

