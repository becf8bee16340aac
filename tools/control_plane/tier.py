"""The whole tier, started in order: Kubernetes (cluster.py); the namespaces the upstream installs use;
every upstream CRD; the installs' configuration and RBAC; KWOK and the stack's nodes; each controller,
waited for until it answers; then the webhook configurations that call them, and what those webhooks
check. Prints one line per component, with its version and where that version comes from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from engines.trainjob import KUEUE_NAMESPACE, TRAINER_NAMESPACE
from infra.keda import NAMESPACE as KEDA_NAMESPACE
from infra.platform import KSERVE_NAMESPACE
from pipeline.argo import ARGO_CONTROLLER_ACCOUNT, ARGO_NAMESPACE
from stacks import render
from testdata import fixtures
from testdata.pins import CRD_PINS
from tools.control_plane import pki, upstream
from tools.control_plane.build import Built
from tools.control_plane.cluster import API_SERVER_ADDRESSES, BRIDGE_ADDRESS, Binaries, Kubernetes, kubeconfig
from tools.control_plane.kube import Api
from tools.control_plane.nodes import kwok
from tools.control_plane.nodes.images import ImageManifest
from tools.control_plane.nodes.k3s import K3S_NODE_LABELS, k3d_agent_name
from tools.control_plane.nodes.real import KUBE_ROUTER_USER, RealNode
from tools.control_plane.processes import Program, answers, cpu_seconds, stop_all

CONTROLLER_START_SECONDS = 180.0
TOKEN_SECONDS = 48 * 3600  # the longest a test session runs
# The Gateway API's CRDs come with the cluster (k3s's Traefik, GKE): the pinned release's.
GATEWAY_API_CRDS = ("gateway.networking.k8s.io_gateways.yaml", "gateway.networking.k8s.io_httproutes.yaml")
ARGO_V4_CRDS = ("argoproj.io_workflows.yaml", "argoproj.io_workflowtemplates.yaml")
KWOK_HEALTH_PORT = 10247


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def pinned_crds(*suffixes: str) -> list[dict]:
    """Pinned upstream CRDs (testdata/pins.py) whose names end with `suffixes`."""
    found = []
    for pin in CRD_PINS.values():
        if pin.name.endswith(suffixes) and not pin.name.startswith("argoproj.io_"):  # v3's, not the stacks'
            found.extend(upstream.load_all(fixtures.resolve(pin).read_text()))
    return found


def service_account_token(api: Api, namespace: str, account: str) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    return api.core.create_namespaced_service_account_token(account, namespace, request).status.token


@dataclasses.dataclass
class Tier:
    directory: Path
    built: list[Built]
    cluster_name: str  # the local stack's k3d cluster, whose nodes the tier plays (named as k3d names them)
    say: Callable[[str], None] = print
    kubernetes: Kubernetes | None = None
    api: Api | None = None
    programs: list[Program] = dataclasses.field(default_factory=list)
    real_node: RealNode | None = None
    simulated: bool = False  # KWOK runs the k3d cluster's simulated node

    @property
    def components(self) -> dict[str, Built]:
        return {component.name: component for component in self.built}

    @property
    def admin(self) -> Path:
        return self.kubernetes.admin

    def kubeconfig_for(self, namespace: str, account: str, name: str) -> Path:
        """A kubeconfig for the tier's API server as a service account (a token, as a pod has)."""
        token = service_account_token(self.api, namespace, account)
        return kubeconfig(self.directory / f"{name}.kubeconfig", self.kubernetes.pki, {"token": token})

    def start_kubernetes(self) -> None:
        """Kubernetes alone: etcd, the API server, the controller manager and the scheduler."""
        certificates = pki.make(self.directory / "pki", API_SERVER_ADDRESSES)
        self.kubernetes = Kubernetes(self.directory, Binaries.of(self.built), certificates)
        self.kubernetes.start()
        self.api = Api(self.admin)

    def start(self, local: render.Rendered) -> None:
        """Starts every component for the local stack's render `local` (its charts' values), each
        upstream controller a process of the tier's."""
        self.start_kubernetes()
        binaries, certificates, api = self.kubernetes.binaries, self.kubernetes.pki, self.api
        api.apply_all(
            namespace(name)
            for name in (TRAINER_NAMESPACE, KUEUE_NAMESPACE, KSERVE_NAMESPACE, ARGO_NAMESPACE, KEDA_NAMESPACE)
        )
        context = upstream.Context(
            self.components,
            binaries.__getitem__,
            certificates,
            self.directory,
            self.admin,
            upstream.rendered_chart_values(local.resources),
        )
        install = upstream.Install()
        for part in (
            upstream.jobset(context),
            upstream.trainer(context),
            upstream.kueue(context),
            upstream.keda(context, BRIDGE_ADDRESS),
            upstream.kserve(context),
        ):
            install.add(part)
        install.crds.extend(pinned_crds(*GATEWAY_API_CRDS))
        argo_crds = pinned_crds(*ARGO_V4_CRDS)
        argo_install = upstream.argo(context, argo_crds, self.directory / "argo.kubeconfig")
        api.create_all([*install.crds, *argo_install.crds])
        api.create_all([*install.before, *argo_install.before])
        # The workflow controller runs as its own service account, with the rights its install gives.
        self.kubeconfig_for(ARGO_NAMESPACE, ARGO_CONTROLLER_ACCOUNT, "argo")
        install.add(dataclasses.replace(argo_install, crds=[], before=[]))
        self._start_kwok(binaries, context)
        self.simulated = True
        started = [
            Program(
                controller.name,
                [binaries[controller.name], *controller.args],
                self.directory / "logs" / f"{controller.name}.log",
                env=controller.env,
            ).start()
            for controller in install.controllers
        ]
        self.programs.extend(started)
        for program, controller in zip(started, install.controllers):
            tls = self.kubernetes.tls() if controller.ready_url.startswith("https:") else None
            program.wait_until(answers(controller.ready_url, tls), "ready", CONTROLLER_START_SECONDS)
        api.apply_all(install.webhooks)
        api.apply_all(install.after)
        self._announce(binaries)

    def _start_kwok(self, binaries: Binaries, context: upstream.Context) -> None:
        stages = self.directory / "kwok-stages.yaml"
        stages.write_text(upstream.yaml.safe_dump_all(kwok.stages(context.module("kwok"))))
        program = Program(
            "kwok",
            [
                binaries["kwok"],
                f"--kubeconfig={self.admin}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={kwok.KWOK_NODE_SELECTOR}",
                f"--cidr={kwok.POD_CIDR}",
                f"--node-ip={kwok.NODE_IP}",
                f"--server-address=127.0.0.1:{KWOK_HEALTH_PORT}",
                "--node-lease-duration-seconds=40",
            ],
            self.directory / "logs" / "kwok.log",
            env={"KWOK_WORKDIR": str(self.directory / "kwok")},
        ).start()
        self.programs.append(program)
        program.wait_until(
            answers(f"http://127.0.0.1:{KWOK_HEALTH_PORT}/healthz"), "ready", CONTROLLER_START_SECONDS
        )
        self.api.apply_all(kwok.k3d_nodes(self.cluster_name))

    @property
    def node_name(self) -> str:
        """The local stack's one node (k3d's server)."""
        (node,) = kwok.k3d_nodes(self.cluster_name)
        return node["metadata"]["name"]

    def program(self, name: str) -> str:
        """The executable of one of the tier's programs (kubectl, pulumi, registry, ...)."""
        return Binaries.of(self.built)[name]

    def announce(self) -> None:
        self._announce(Binaries.of(self.built))

    def _announce(self, binaries: Binaries) -> None:
        for component in self.built:
            programs = ", ".join(
                name
                for name, version in binaries.versions.items()
                if binaries.paths[name] in component.binaries.values()
            )
            what = programs or "its module only: CRDs, charts, manifests"
            note = f"; {component.note}" if component.note else ""
            self.say(
                f"control-plane: {component.name} {component.version} ({what}; pinned by "
                f"{component.pinned_by}{note})"
            )

    def start_real_node(self, images: ImageManifest, registries: tuple[str, ...] = ()) -> RealNode:
        """The real node (tools/control_plane/nodes/real.py), k3d's first agent as k3d names it, as the
        cluster's one schedulable node (the simulated one, if any, cordoned, so that every pod lands
        here), pulling from `registries` too, and the local-path provisioner k3s runs, whose helper pods
        need a node that runs them."""
        if self.simulated:
            self.api.patch("v1", "Node", self.node_name, {"spec": {"unschedulable": True}})
        kube_router = Path(self.components["kube-router"].module_dir)
        self.api.apply_all(upstream.kube_router_access(kube_router, KUBE_ROUTER_USER))
        self.real_node = RealNode(
            self.directory / "node",
            Binaries.of(self.built),
            self.kubernetes.pki,
            k3d_agent_name(self.cluster_name),
            K3S_NODE_LABELS,
            images,
            registries,
            say=self.say,
        )
        self.real_node.start(self.api)
        self.real_node.announce()
        self._start_local_path()
        return self.real_node

    def _start_local_path(self) -> None:
        storage = self.directory / "node" / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        provisioner = self.components["local-path-provisioner"]
        install = upstream.local_path(Path(provisioner.module_dir), storage, self.admin)
        self.api.apply_all(install.objects)
        (executable,) = provisioner.binaries.values()
        program = Program(
            "local-path-provisioner",
            [executable, *install.args],
            self.directory / "logs" / "local-path-provisioner.log",
        ).start()
        self.programs.append(program)
        program.wait_until(lambda: upstream.LOCAL_PATH_READY_LINE in program.tail(), "started",
                           CONTROLLER_START_SECONDS)
        self.say(f"control-plane: local-path-provisioner {provisioner.version} (rancher.io/local-path; "
                 f"volumes under {storage})")

    def stop(self) -> None:
        used = cpu_seconds([*self.programs, *(self.kubernetes.programs if self.kubernetes else []),
                            *(self.real_node.programs if self.real_node else [])])
        if self.real_node is not None:
            used["the node's pods"] = self.real_node.pods_cpu_seconds()
        self.say(f"CPU seconds, {sum(used.values()):.0f} in all: " + ", ".join(
            f"{name} {seconds:.0f}" for name, seconds in sorted(used.items(), key=lambda item: -item[1])))
        if self.real_node is not None:
            self.real_node.stop()
        stop_all([*self.programs, *(self.kubernetes.programs if self.kubernetes else [])])
