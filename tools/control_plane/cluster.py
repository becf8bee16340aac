"""Kubernetes itself: etcd, kube-apiserver (RBAC, the default admission plugins and NodeRestriction, as
kubeadm and k3s configure it), kube-controller-manager (each controller with its own service account,
as kubeadm runs it) and kube-scheduler, on fixed ports of a network namespace that is the tier's alone
(tools/control_plane/__main__.py makes it), so that no port is shared with anything else.

The API server advertises the tier's bridge address (pods are attached to that bridge), listens on
every address of the namespace, and is reached at 127.0.0.1 by the tier, the tests and the
controllers (each controller with the admin's credentials).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import ssl
from pathlib import Path

import yaml

from common.cluster_names import CLUSTER_DOMAIN
from tools.control_plane.build import Built, program_name
from tools.control_plane.pki import FRONT_PROXY_NAME, Pki
from tools.control_plane.processes import Program, answers, stop_all

ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
API_SERVER_PORT = 6443
API_SERVER = f"https://127.0.0.1:{API_SERVER_PORT}"
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 10257, 10259
BRIDGE, BRIDGE_ADDRESS, BRIDGE_PREFIX = "tier0", "10.244.0.1", 16  # pods' network (see pods.py)
SERVICE_CIDR = "10.96.0.0/16"
# Where a pod reaches the API server: the `kubernetes` Service (the service range's first address),
# whose endpoint is the advertised bridge address.
API_SERVER_ADDRESSES = (str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())), BRIDGE_ADDRESS)
SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"
START_TIMEOUT_SECONDS = 120.0
# Set by the launcher inside the tier's own network namespace; without it, the tier refuses to start
# rather than bind fixed ports beside whatever else runs on this machine.
NAMESPACE_ENV = "DIST_ML_CONTROL_PLANE_NAMESPACE"


class NotIsolated(RuntimeError):
    """The tier was asked to start outside its own network namespace."""


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Each program's executable, by its main package's last path element (or its component's name)."""

    paths: dict[str, str]
    versions: dict[str, str]  # program -> the component's version

    @classmethod
    def of(cls, built: list[Built]) -> Binaries:
        paths, versions = {}, {}
        for component in built:
            for package, path in component.binaries.items():
                name = program_name(component.name, package)
                paths[name], versions[name] = path, component.version
        return cls(paths, versions)

    def __getitem__(self, program: str) -> str:
        return self.paths[program]


def kubeconfig(path: Path, pki: Pki, user: dict) -> Path:
    """A kubeconfig for the tier's API server as `user` (client certificate, or a token)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "tier",
                "clusters": [
                    {
                        "name": "tier",
                        "cluster": {"server": API_SERVER, "certificate-authority": str(pki.ca.cert)},
                    }
                ],
                "users": [{"name": "tier", "user": user}],
                "contexts": [{"name": "tier", "context": {"cluster": "tier", "user": "tier"}}],
            }
        )
    )
    return path


def admin_kubeconfig(path: Path, pki: Pki) -> Path:
    return kubeconfig(
        path, pki, {"client-certificate": str(pki.admin.cert), "client-key": str(pki.admin.key)}
    )


@dataclasses.dataclass
class Kubernetes:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler, started in that order."""

    directory: Path
    binaries: Binaries
    pki: Pki
    programs: list[Program] = dataclasses.field(default_factory=list)

    @property
    def admin(self) -> Path:
        return self.directory / "admin.kubeconfig"

    def tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        return context

    def _start(self, name: str, args: list[str], ready, what: str = "answering") -> Program:
        program = Program(name, [self.binaries[name], *args], self.directory / "logs" / f"{name}.log").start()
        self.programs.append(program)
        program.wait_until(ready, what, START_TIMEOUT_SECONDS)
        return program

    def start(self) -> None:
        if os.environ.get(NAMESPACE_ENV) != "1":
            raise NotIsolated(
                "the control-plane tier binds fixed ports, so it runs only in a network "
                "namespace of its own: start it with `python -m tools.control_plane test` "
                "(make test-cluster) or `python -m tools.control_plane up`"
            )
        admin_kubeconfig(self.admin, self.pki)
        etcd = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"
        peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
        self._start(
            "etcd",
            [
                "--name=tier",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={etcd}",
                f"--advertise-client-urls={etcd}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=tier={peer}",
                "--unsafe-no-fsync",  # a test's data: no durability needed, and fsyncs slow a loaded machine
            ],
            answers(f"{etcd}/health"),
        )
        pki = self.pki
        self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd}",
                "--bind-address=0.0.0.0",
                f"--secure-port={API_SERVER_PORT}",
                f"--advertise-address={BRIDGE_ADDRESS}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--tls-cert-file={pki.api_server.cert}",
                f"--tls-private-key-file={pki.api_server.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.service_account_public}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                "--authorization-mode=Node,RBAC",
                # Logs, exec and port-forward reach the real node's kubelet as the admin (group
                # system:masters, which the kubelet's webhook authorization asks the API server about).
                f"--kubelet-client-certificate={pki.admin.cert}",
                f"--kubelet-client-key={pki.admin.key}",
                "--kubelet-preferred-address-types=InternalIP",
                # The default plugins (NamespaceLifecycle, ServiceAccount, the webhooks, ResourceQuota, ...)
                # and NodeRestriction, which kubeadm and k3s add.
                "--enable-admission-plugins=NodeRestriction",
                # The aggregation layer, as kubeadm configures it: it calls an aggregated API server
                # (KEDA's metrics adapter) with its front-proxy certificate and the caller's identity
                # in headers, at the address of the APIService's Service's endpoint (no kube-proxy
                # needed where the adapter is a process on the tier's bridge).
                f"--requestheader-client-ca-file={pki.ca.cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_NAME}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy.cert}",
                f"--proxy-client-key-file={pki.front_proxy.key}",
                "--enable-aggregator-routing=true",
                "--allow-privileged=true",
                "--profiling=false",
            ],
            answers(f"{API_SERVER}/readyz", self.tls()),
            "ready",
        )
        self._start(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.admin}",
                f"--authentication-kubeconfig={self.admin}",
                f"--authorization-kubeconfig={self.admin}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={CONTROLLER_MANAGER_PORT}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
            ],
            answers(f"https://127.0.0.1:{CONTROLLER_MANAGER_PORT}/healthz", insecure()),
        )
        self._start(
            "kube-scheduler",
            [
                f"--kubeconfig={self.admin}",
                f"--authentication-kubeconfig={self.admin}",
                f"--authorization-kubeconfig={self.admin}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={SCHEDULER_PORT}",
            ],
            answers(f"https://127.0.0.1:{SCHEDULER_PORT}/healthz", insecure()),
        )

    def stop(self) -> None:
        stop_all(self.programs)


def insecure() -> ssl.SSLContext:
    """For the health endpoints of the controller manager and the scheduler, which serve a certificate
    they made themselves: whether they answer is all that is asked."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
