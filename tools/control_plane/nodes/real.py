"""A real node beside the tier's control plane: pods that run.

- containerd and runc, Debian's packages (the versions a Debian host runs; building them from their Go
  modules would add minutes to a cold build and prove nothing more about our pods), with the CNI
  plugins from Debian's package (bridge and host-local on the tier's bridge, portmap, loopback);
- the kubelet and kube-proxy, from the same pinned Kubernetes module as the API server;
- CoreDNS from its Go module, at the version kubeadm of that Kubernetes installs, serving the cluster
  domain the stacks assume (cluster.local) on the bridge's address, the node's DNS for its pods;
- kube-router's network policy controller, built from k3s' fork of its module, run alone as k3s' agent
  runs it: the NetworkPolicies the stacks declare are enforced on the node's pods, as on k3d (Debian's
  ipset beside iptables; the namespace's bridge netfilter is on, so pod-to-pod traffic on the bridge
  passes its rules too).

Everything lives under the tier's directory (containerd's state, the kubelet's, the CNI's address
leases) but the images: images.py builds them in buildah's storage outside the clone, and containerd
imports them at start, streamed from buildah, under the names the rendered stack uses into a root
shared by the tiers of this machine one at a time (SHARED_ROOT), so that a warm run imports nothing.

The node registers with a client certificate of `system:node:<name>` (the API server's Node authorizer
and NodeRestriction judge it, as on a kubeadm node); kube-proxy as `system:kube-proxy` (bound by the
API server's own system:node-proxier); kube-router as `system:kube-router`, bound to the ClusterRole of
kube-router's own install. Pods reach Services through kube-proxy's iptables rules in the
tier's network namespace; every connection to a Service is masqueraded (kube-proxy's masqueradeAll;
pods share one bridge). kube-router's rules see the client's own address all the same: the filter
table's FORWARD chain runs before the masquerade.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Iterator

import yaml

from common.cluster_names import CLUSTER_DOMAIN
from common.installs import mirrored
from engines.base import condition
from tools.control_plane import pki as tier_pki
from tools.control_plane.build import MACHINE_CACHE, Unavailable, disk_bytes, held_alone, shown_bytes
from tools.control_plane.cluster import (
    BRIDGE,
    BRIDGE_ADDRESS,
    BRIDGE_PREFIX,
    SERVICE_CIDR,
    Binaries,
    kubeconfig,
)
from tools.control_plane.kube import Api
from tools.control_plane.nodes.images import NODE, ImageManifest, export_argv
from tools.control_plane.processes import Program, StartError, answers, stop_all

# The real node's pods: addresses of the tier's bridge network (KWOK's are 10.244.1.0/24), the bridge's
# own address their gateway (the bridge plugin refuses a bridge that holds another address).
POD_RANGE = ("10.244.2.2", "10.244.2.254")
CLUSTER_CIDR = f"10.244.0.0/{BRIDGE_PREFIX}"
DNS_ADDRESS = BRIDGE_ADDRESS  # CoreDNS answers on the bridge, where every pod reaches the node
KUBELET_PORT, KUBELET_HEALTH_PORT = 10250, 10248
KUBE_PROXY_HEALTH_PORT, KUBE_PROXY_METRICS_PORT = 10256, 10249
COREDNS_READY_PORT, COREDNS_HEALTH_PORT = 8181, 8180
KUBE_ROUTER_HEALTH_PORT = 20244  # its default
KUBE_ROUTER_USER = "system:kube-router"
# kube-router's chain in the filter table once its network policy controller has synced
# (pkg/controllers/netpol/network_policy_controller.go, kubeForwardChainName).
KUBE_ROUTER_CHAIN = "KUBE-ROUTER-FORWARD"
# Debian's containernetworking-plugins install their plugins here.
CNI_BIN_DIR = "/usr/lib/cni"
# Where the node's containerd sends a pull from any registry but the tier's: a closed port on its own
# loopback (the discard port), so that a reference to Docker Hub or elsewhere fails here, refused.
CLOSED_REGISTRY = "127.0.0.1:9"
PULL_REQUEST = re.compile(r'msg="PullImage \\"([^"\\]+)\\"')  # containerd's CRI log of each pull asked
RUNTIME_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ipset")
RUNTIME_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "ipset")
CGROUPS = Path("/sys/fs/cgroup")
# containerd's root that tiers share, one at a time, outside the clone beside the images' build cache.
SHARED_ROOT = MACHINE_CACHE / "node-containerd"
CGROUP_REMOVE_SECONDS = 10.0
START_SECONDS = 120.0
READY_SECONDS = 120.0
IMPORT_SECONDS = 600.0
# The kubelet's reasons for a container that will not start without a change to the pod or the image.
NEVER_STARTS = {"CreateContainerConfigError", "ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull",
                "InvalidImageName", "CreateContainerError"}


def waiting_containers(pod: dict) -> Iterator[tuple[dict, dict]]:
    """Each of the pod's containers (its init containers first) that waits: its status and why."""
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            yield container, waiting


def never_starts(api: Api, namespace: str | None = None, since: datetime.datetime | None = None) -> list[str]:
    """Each container that the kubelet says will not start, in its words: of `namespace`'s pods (every
    namespace's by default), and of those made `since` then (an earlier update's pods are not waited for
    anew)."""
    found = []
    for pod in api.list("v1", "Pod", namespace):
        created = datetime.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        if since is not None and created < since:
            continue
        for container, waiting in waiting_containers(pod):
            if waiting.get("reason") in NEVER_STARTS:
                found.append(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} container "
                             f"{container['name']}: {waiting['reason']}: {waiting.get('message')}")
    return found


def real_root(uid_map: Path = Path("/proc/self/uid_map")) -> bool:
    """Root of the machine, not of a user namespace (where the tier runs for other users): the kubelet and
    containerd need the machine's cgroups."""
    return uid_map.read_text().split()[:3] == ["0", "0", "4294967295"]


def missing_programs() -> list[str]:
    missing = [name for name in RUNTIME_PROGRAMS if shutil.which(name) is None]
    missing += [f"{CNI_BIN_DIR}/{plugin}" for plugin in ("bridge", "host-local", "loopback", "portmap")
                if not Path(CNI_BIN_DIR, plugin).is_file()]
    return missing


def registry_hosts(directory: Path, registries: tuple[str, ...]) -> Path:
    """containerd's registry configuration (config_path: one hosts.toml per registry, as k3s writes its
    registries.yaml out): each of `registries` reached over plain HTTP, and every other registry
    (containerd's `_default`) at a closed port on the node's own loopback, so that no pull leaves the
    machine."""
    for registry in registries:
        (directory / registry).mkdir(parents=True, exist_ok=True)
        (directory / registry / "hosts.toml").write_text(
            f'server = "http://{registry}"\n\n'
            f'[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n')
    (directory / "_default").mkdir(parents=True, exist_ok=True)
    (directory / "_default" / "hosts.toml").write_text(f'server = "http://{CLOSED_REGISTRY}"\n')
    return directory


def containerd_config(
    directory: Path, socket: Path, pause_image: str, root: Path | None = None, cri: bool = True,
    registries: Path | None = None,
) -> str:
    """containerd's configuration (version 2, containerd 1.6): its root (`root`, else under
    `directory`), state and socket; the CRI plugin (unless `cri` is false) with the pause image the
    kubelet's Kubernetes pins, runc, cgroupfs (the kubelet's driver: no systemd here), the CNI
    plugins and the registries' hosts (`registries`, registry_hosts)."""
    plugin = "io.containerd.grpc.v1.cri"
    cri_off = f', "{plugin}"' if not cri else ""
    cri = f'plugins."{plugin}"'
    return f"""version = 2
root = "{root or directory / 'root'}"
state = "{directory / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"{cri_off}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{directory / 'opt'}"

[{cri}]
  sandbox_image = "{pause_image}"
  enable_selinux = false
  # The pods' network namespaces under the tier's state, not the machine's /run/netns.
  netns_mounts_under_state_dir = true
  # The machine may not grant CAP_SYS_RESOURCE (a container's root, as here): no pod's oom_score_adj
  # below containerd's own, as rootless containerd runs.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{directory / 'cni'}"
  [{cri}.registry]
    config_path = "{registries or directory / 'certs.d'}"
"""


def cni_network(directory: Path) -> dict:
    """The pods' network: a veth on the tier's bridge each, addresses from POD_RANGE (leases under the
    tier's directory, not the machine's /var/lib/cni), the bridge as their gateway; portmap for
    hostPorts."""
    return {
        "cniVersion": "1.0.0",
        "name": "tier",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(directory / "ipam"),
                    "ranges": [[{
                        "subnet": CLUSTER_CIDR,
                        "rangeStart": POD_RANGE[0],
                        "rangeEnd": POD_RANGE[1],
                        "gateway": BRIDGE_ADDRESS,
                    }]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def cgroup_dirs(name: str, cgroups: Path = CGROUPS) -> list[Path]:
    """The node's cgroup `name` in every hierarchy: cgroup v2's one, or each of v1's controllers."""
    if (cgroups / "cgroup.controllers").is_file():
        return [cgroups / name]
    return [hierarchy / name for hierarchy in sorted(cgroups.iterdir())
            if not hierarchy.is_symlink() and (hierarchy / "cgroup.procs").is_file()]


def signalled(pids: Iterable[int | str], signum: signal.Signals) -> int:
    """`signum` to each of `pids`, but those that have ended meanwhile; how many were signalled."""
    count = 0
    for pid in pids:
        try:
            os.kill(int(pid), signum)
        except ProcessLookupError:
            continue
        count += 1
    return count


def kill_cgroup_trees(roots: list[Path]) -> None:
    """Every process under `roots` killed, then the cgroups removed, deepest first. A cgroup may go
    while this walks it (its pod's last process reaped): os.walk passes over what vanished."""
    for root in roots:
        for directory, _, _ in os.walk(root):
            try:
                pids = Path(directory, "cgroup.procs").read_text().split()
            except OSError:
                continue
            signalled(pids, signal.SIGKILL)
    deadline = time.monotonic() + CGROUP_REMOVE_SECONDS
    for root in roots:
        for directory, _, _ in os.walk(root, topdown=False):
            while os.path.isdir(directory):
                try:
                    os.rmdir(directory)
                except OSError as error:  # busy until the kernel has reaped its killed processes
                    if error.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)


def kubelet_config(
    directory: Path, pki: tier_pki.Pki, serving: tier_pki.KeyPair, socket: Path, cgroup_root: str
) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": BRIDGE_ADDRESS,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTH_PORT,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        # The node's pods under a cgroup of its own: a second tier's kubelet on the machine would remove
        # pod cgroups it does not know under the shared default root.
        "cgroupRoot": cgroup_root,
        "podLogsDir": str(directory / "pod-logs"),
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_ADDRESS],
        # The machine's resolvers are outside the tier and unreachable from it: pods get the cluster's.
        "resolvConf": str(directory / "resolv.conf"),
        "failSwapOn": False,
        # The machine's kernel mounts cgroups v1, on which the kubelet refuses to start from 1.35 unless
        # told (k8s.io/kubelet v0.35 config/v1beta1 types.go FailCgroupV1, KEP-5573); GKE's nodes and
        # current Docker hosts run cgroup v2, where this changes nothing.
        "failCgroupV1": False,
        "staticPodPath": "",
        # The images cannot be pulled again (no registry): never collected, whatever the disk holds.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "imageMinimumGCAge": "87600h",
        # A developer's disk may be fuller than a node's: evict on memory alone.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%"},
        "serializeImagePulls": False,
        "volumeStatsAggPeriod": "0s",
        "nodeStatusReportFrequency": "10s",
    }


def kube_proxy_config(kubeconfig_path: Path, node_name: str) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": BRIDGE_ADDRESS,
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTH_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        "iptables": {"masqueradeAll": True},
        # Zero leaves the machine's conntrack settings alone: a network namespace may not write them.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(kubeconfig_path: Path) -> str:
    """kubeadm's Corefile for the cluster domain, without `forward` (nothing outside the tier answers)."""
    return f""".:53 {{
    bind {DNS_ADDRESS}
    errors
    health 127.0.0.1:{COREDNS_HEALTH_PORT}
    ready 127.0.0.1:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig_path}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
}}
"""


@dataclasses.dataclass
class RealNode:
    """containerd, the kubelet, kube-proxy and CoreDNS for one node named `name`."""

    directory: Path
    binaries: Binaries
    pki: tier_pki.Pki
    name: str
    labels: dict[str, str]
    images: ImageManifest  # its own (NODE) loaded into containerd at start
    registries: tuple[str, ...] = ()  # plain-HTTP registries it pulls from (the tier's)
    root: Path | None = None  # containerd's: the shared store, or the tier's own
    _lock: object = None  # the shared store's, while this node holds it
    say: callable = print
    programs: list[Program] = dataclasses.field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.directory / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/dist-ml-tier-{os.getpid()}"

    def start(self, api: Api) -> None:
        if not real_root():
            raise Unavailable("the real node needs root (a cgroup hierarchy of its own, containerd)")
        missing = missing_programs()
        if missing:
            raise Unavailable(
                f"the real node needs {', '.join(missing)} (Debian's containerd, runc, iptables, ipset "
                "and containernetworking-plugins)"
            )
        # A node reaches Service addresses by its default route; the tier's namespace has none (nothing
        # outside answers), so the service range is routed to the bridge, where kube-proxy's rules act.
        subprocess.run(["ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE], check=True)
        self._start_containerd()
        self._import_images()
        self._start_kubelet(api)
        self._start_kube_proxy()
        self._start_kube_router()
        self._start_coredns()

    def _program(self, name: str, command: list[str], ready, what: str = "ready") -> Program:
        program = Program(name, command, self.directory / "logs" / f"{name}.log").start()
        self.programs.append(program)
        program.wait_until(ready, what, START_SECONDS)
        return program

    def _shared_root(self) -> Path | None:
        """The store outside the clone whose images (gigabytes, unpacked) a warm run reuses, held for
        this tier alone; None when another tier on the machine holds it (this one gets its own)."""
        self._lock = held_alone(SHARED_ROOT)
        if self._lock is None:
            self.say("control-plane: another tier holds the node's shared image store: loading a store of "
                     "this tier's own")
            return None
        return SHARED_ROOT

    def _start_containerd(self) -> None:
        runtime = self.directory / "containerd"
        (runtime / "cni").mkdir(parents=True, exist_ok=True)
        (runtime / "cni" / "10-tier.conflist").write_text(json.dumps(cni_network(runtime), indent=2))
        self.root = self._shared_root() or runtime / "root"
        if self.root == SHARED_ROOT:
            self._forget_containers(runtime)
        config = runtime / "config.toml"
        hosts = registry_hosts(runtime / "certs.d", self.registries)
        config.write_text(containerd_config(runtime, self.socket, self.images.pause, self.root,
                                            registries=hosts))
        self._program("containerd", ["containerd", "--config", str(config)], self.socket.exists, "listening")

    def _forget_containers(self, runtime: Path) -> None:
        """The containers an earlier tier left in the shared store (its pods, killed with it), removed
        before the CRI plugin starts and would take them for this node's: containerd alone, then them."""
        config = runtime / "forget.toml"
        config.write_text(containerd_config(runtime, self.socket, self.images.pause, self.root, cri=False))
        program = Program("containerd-forget", ["containerd", "--config", str(config)],
                          self.directory / "logs" / "containerd-forget.log").start()
        try:
            program.wait_until(self.socket.exists, "listening", START_SECONDS)
            for container in self.ctr("containers", "list", "--quiet").split():
                self.ctr("containers", "delete", container)
        finally:
            program.stop()
            self.socket.unlink(missing_ok=True)

    def ctr(self, *args: str, timeout: float = IMPORT_SECONDS) -> str:
        done = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout,
        )
        if done.returncode != 0:
            raise StartError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def forget(self, image: str) -> None:
        """`image` out of the node's store, so that the kubelet must pull it (absent: nothing to do)."""
        if image in self.ctr("images", "list", "--quiet").split():
            self.ctr("images", "remove", image)

    def pulls_outside(self) -> list[str]:
        """Each image the kubelet asked containerd to pull from a registry other than the tier's, by
        containerd's own log of the requests."""
        log = (self.directory / "logs" / "containerd.log").read_text(errors="replace")
        return sorted({reference for reference in PULL_REQUEST.findall(log)
                       if reference.partition("/")[0] not in self.registries})

    def container_pids(self, container_id: str) -> list[int]:
        """The host PIDs of a running container's processes (containerd's listing of its task)."""
        listing = self.ctr("tasks", "ps", container_id.removeprefix("containerd://"), timeout=30)
        return [int(row.split()[0]) for row in listing.splitlines()[1:] if row.strip()]

    def kill_container(self, container_id: str) -> None:
        """SIGKILL to every process of a running container (a pod status's `containerd://<id>`), as the
        kernel's OOM killer or a crash ends it: the kubelet sees it exit 137."""
        self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", container_id.removeprefix("containerd://"),
                 timeout=30)

    def _import_images(self) -> None:
        """Each of the node's own images imported, but one the store already holds from the same build
        (buildah's ID); then every image the run does not use removed (_prune_store)."""
        record = self.root / "dist-ml-imported.json"
        imported = json.loads(record.read_text()) if record.is_file() else {}
        own = [(image.name, image.image_id) for image in self.images.of(NODE)]
        for image, built in own:
            if imported.get(image) == built:
                self.say(f"control-plane: node image {image} (in the store)")
                continue
            started = time.monotonic()
            self._import_from_buildah(image)
            imported[image] = built
            record.write_text(json.dumps(imported, indent=2))
            self.say(f"control-plane: node image {image} loaded in {time.monotonic() - started:.0f} s")
        self._prune_store()
        record.write_text(json.dumps({image: imported.get(image) for image, _ in own}, indent=2))

    def used_names(self) -> set[str]:
        """The images of the run, as the node's store names them: its own, and those it pulls from the
        tier's registries (the project's and the platform's, where the stack's config and its image
        mirror name them)."""
        pulled = {mirrored(image.name, registry) for image in self.images.built if image.role != NODE
                  for registry in self.registries}
        return {image.name for image in self.images.of(NODE)} | pulled

    def _prune_store(self) -> None:
        """Every image of the store the run does not use removed, each by all its names, and its content
        with it (`--sync`: containerd's garbage collector drops what no image refers to before this
        returns); says what went and the bytes freed."""
        removed = stale_in_store(listed_in_store(self.ctr("images", "list")), self.used_names())
        if not removed:
            return
        before = disk_bytes(self.root)
        self.ctr("images", "delete", "--sync", *removed)
        self.say(f"control-plane: the node's store: removed {len(removed)} image names the run does not use, "
                 f"{shown_bytes(before - disk_bytes(self.root))} freed: {', '.join(sorted(removed))}")

    def _import_from_buildah(self, image: str) -> None:
        """buildah's docker-archive of `image` piped into `ctr images import -`."""
        export_log = self.directory / "logs" / "image-export.log"
        export_log.parent.mkdir(parents=True, exist_ok=True)
        with export_log.open("w") as errors:
            exporter = subprocess.Popen(export_argv(image), stdout=subprocess.PIPE, stderr=errors)
            try:
                done = subprocess.run(
                    ["ctr", "--address", str(self.socket), "--namespace", "k8s.io",
                     "images", "import", "--no-unpack", "-"],
                    stdin=exporter.stdout, capture_output=True, text=True, timeout=IMPORT_SECONDS,
                )
            finally:
                exporter.stdout.close()
                exported = exporter.wait(timeout=IMPORT_SECONDS)
        if exported != 0:
            raise StartError(f"buildah push {image}: {export_log.read_text().strip()}")
        if done.returncode != 0:
            raise StartError(f"ctr images import {image}: {done.stderr.strip()}")

    def _client(self, name: str, common_name: str, organization: str | None) -> Path:
        pair = tier_pki.issue_client(self.pki, self.directory / "pki", name, common_name, organization)
        return kubeconfig(
            self.directory / f"{name}.kubeconfig",
            self.pki,
            {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
        )

    def _start_kubelet(self, api: Api) -> None:
        kubelet = self.directory / "kubelet"
        kubelet.mkdir(parents=True, exist_ok=True)
        (kubelet / "resolv.conf").write_text("")
        serving = tier_pki.issue_serving(self.pki, self.directory / "pki", "kubelet", (BRIDGE_ADDRESS,))
        for directory in cgroup_dirs(self.cgroup_root.lstrip("/")):
            directory.mkdir(exist_ok=True)
        config = kubelet / "config.yaml"
        config.write_text(
            yaml.safe_dump(kubelet_config(kubelet, self.pki, serving, self.socket, self.cgroup_root))
        )
        node_kubeconfig = self._client("kubelet", f"system:node:{self.name}", "system:nodes")
        labels = ",".join(f"{key}={value}" for key, value in self.labels.items())
        kubelet_program = self._program(
            "kubelet",
            [
                self.binaries["kubelet"],
                f"--config={config}",
                f"--kubeconfig={node_kubeconfig}",
                f"--root-dir={kubelet / 'root'}",
                f"--cert-dir={kubelet / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={BRIDGE_ADDRESS}",
                *([f"--node-labels={labels}"] if labels else []),
            ],
            answers(f"http://127.0.0.1:{KUBELET_HEALTH_PORT}/healthz"),
        )
        kubelet_program.wait_until(
            lambda: node_ready(api, self.name), f"node {self.name} Ready", READY_SECONDS
        )

    def _start_kube_proxy(self) -> None:
        proxy_kubeconfig = self._client("kube-proxy", "system:kube-proxy", None)
        config = self.directory / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(kube_proxy_config(proxy_kubeconfig, self.name)))
        self._program(
            "kube-proxy",
            [self.binaries["kube-proxy"], f"--config={config}"],
            answers(f"http://127.0.0.1:{KUBE_PROXY_HEALTH_PORT}/healthz"),
        )

    def _start_kube_router(self) -> None:
        """kube-router's network policy controller alone, as k3s' agent runs it (no routes, no service
        proxy: the bridge and kube-proxy do those), ready once its chains are in the filter table."""
        router_kubeconfig = self._client("kube-router", KUBE_ROUTER_USER, None)
        program = self._program(
            "kube-router",
            [
                self.binaries["kube-router"],
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                f"--kubeconfig={router_kubeconfig}",
                f"--hostname-override={self.name}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--health-port={KUBE_ROUTER_HEALTH_PORT}",
            ],
            answers(f"http://127.0.0.1:{KUBE_ROUTER_HEALTH_PORT}/healthz"),
        )
        program.wait_until(lambda: filter_chain_exists(KUBE_ROUTER_CHAIN), "its network policy chains",
                           START_SECONDS)

    def _start_coredns(self) -> None:
        admin = self.directory.parent / "admin.kubeconfig"
        config = self.directory / "Corefile"
        config.write_text(corefile(admin))
        self._program(
            "coredns",
            [self.binaries["coredns"], "-conf", str(config)],
            answers(f"http://127.0.0.1:{COREDNS_READY_PORT}/ready"),
        )

    def announce(self) -> None:
        versions = self.binaries.versions
        self.say(
            f"control-plane: node {self.name}: kubelet and kube-proxy {versions['kubelet']}, "
            f"{runtime_versions()}, CoreDNS {versions['coredns']} ({CLUSTER_DOMAIN}), kube-router "
            f"{versions['kube-router']} (its NetworkPolicy controller, as k3s runs it); images: "
            + ", ".join(image.name for image in self.images.of(NODE))
        )

    def pods_cpu_seconds(self) -> float:
        """The CPU time of every pod the node has run (its cgroup root's, cgroup v1's cpuacct or v2's)."""
        for directory in cgroup_dirs(self.cgroup_root.lstrip("/")):
            if (directory / "cpuacct.usage").is_file():
                return int((directory / "cpuacct.usage").read_text()) / 1e9
            stat = directory / "cpu.stat"
            usage = dict(line.split() for line in stat.read_text().splitlines()) if stat.is_file() else {}
            if "usage_usec" in usage:  # cgroup v2's; v1's cpu controller has no usage of its own
                return int(usage["usage_usec"]) / 1e6
        return 0.0

    def stop(self) -> None:
        """The node's programs, then its pods' processes (containerd's shims outlive it, and the
        containers their shims), its shims, and its cgroups."""
        runtime = [program for program in self.programs if program.name == "containerd"]
        stop_all([program for program in self.programs if program not in runtime])
        kill_cgroup_trees(cgroup_dirs(self.cgroup_root.lstrip("/")))
        shims = subprocess.run(["pgrep", "-f", f"containerd-shim-runc-v2 .*-address {self.socket}"],
                               capture_output=True, text=True).stdout.split()
        signalled(shims, signal.SIGKILL)
        stop_all(runtime)
        if self._lock is not None:
            self._lock.close()


def listed_in_store(listing: str) -> list[tuple[str, str]]:
    """(name, target digest) of each image in `ctr images list`'s table (REF TYPE DIGEST SIZE ...)."""
    rows = [line.split() for line in listing.splitlines()[1:]]
    return [(row[0], row[2]) for row in rows if len(row) >= 3]


def stale_in_store(listed: list[tuple[str, str]], used: set[str]) -> list[str]:
    """The names to remove from the node's store: every name of each image (its target) none of whose
    names the run uses: its tag, and the digest and ID names the CRI plugin gave it, so that nothing
    refers to its content any more."""
    used_targets = {digest for name, digest in listed if name in used}
    return [name for name, digest in listed if digest not in used_targets]


def filter_chain_exists(chain: str) -> bool:
    return subprocess.run(["iptables", "-t", "filter", "-S", chain], capture_output=True).returncode == 0


def node_ready(api: Api, name: str) -> bool:
    return condition(api.get("v1", "Node", name) or {}, "Ready") is not None


def runtime_versions() -> str:
    """The runtime's Debian packages and their versions, as dpkg has them."""
    versions = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *RUNTIME_PACKAGES],
        capture_output=True, text=True,
    ).stdout.strip().splitlines()
    return ", ".join(versions) + " (Debian's packages)"
