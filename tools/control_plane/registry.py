"""The end-to-end tier's container registry: the CNCF's Distribution (`registry serve`, built from its Go
module), on the tier's bridge, where the node's containerd pulls what the kubelet asks for. The tier
pushes to it as a user's CI pushes to a cluster's registry: the project's images under the references
the stack's config names, and the platform's images under their upstream paths, as into a mirror
(`platform.imageMirror`). Nothing reaches the node behind the stack's back.

Its storage is outside the clone (STORAGE), held by one tier at a time (a second tier on the machine
gets a store of its own): a warm run's pushes find every layer there and send none. Plain HTTP on the
bridge, which only the tier's namespace sees: containerd is told so for this one registry.
"""

from __future__ import annotations

import dataclasses
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from common.installs import mirrored, split_tag
from tools.control_plane.build import MACHINE_CACHE, held_alone
from tools.control_plane.cluster import BRIDGE_ADDRESS
from tools.control_plane.nodes.images import BUILDAH_ROLE, require
from tools.control_plane.processes import Program, StartError, answers

PORT = 5000
ADDRESS = f"{BRIDGE_ADDRESS}:{PORT}"
STORAGE = MACHINE_CACHE / "registry"
START_SECONDS = 60.0
PUSH_SECONDS = 1800.0
# What buildah pushes (Docker's v2 schema 2, or OCI's): asked for by name, the registry answers its digest.
MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json, "
                  "application/vnd.oci.image.manifest.v1+json")


def config(storage: Path) -> dict:
    """Distribution's configuration: its filesystem driver on `storage`, on the bridge, no auth."""
    return {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "cache": {"blobdescriptor": "inmemory"}},
        "http": {"addr": ADDRESS},
        "health": {"storagedriver": {"enabled": False}},
    }


@dataclasses.dataclass
class Registry:
    directory: Path  # the tier's: its config and log
    executable: str
    say: callable = print
    program: Program | None = None
    _lock: object = None

    @property
    def address(self) -> str:
        return ADDRESS

    def start(self) -> Registry:
        storage = self._storage()
        path = self.directory / "registry.yaml"
        path.write_text(yaml.safe_dump(config(storage)))
        self.program = Program("registry", [self.executable, "serve", str(path)],
                               self.directory / "logs" / "registry.log").start()
        self.program.wait_until(answers(f"http://{ADDRESS}/v2/"), "answering", START_SECONDS)
        self.say(f"control-plane: registry {ADDRESS} (Distribution; its store {storage})")
        return self

    def _storage(self) -> Path:
        self._lock = held_alone(STORAGE)
        if self._lock is not None:
            return STORAGE
        self.say("control-plane: another tier holds the registry's store: pushing into one of this tier's "
                 "own")
        own = self.directory / "registry-storage"
        own.mkdir(exist_ok=True)
        return own

    def push(self, local: str, remote: str) -> None:
        """buildah's image `local` to `remote` in this registry, its layers uncompressed (on the
        bridge, compressing them would cost the cores more than it saves)."""
        done = subprocess.run(
            [require("buildah", BUILDAH_ROLE), "push", "--quiet",
             "--tls-verify=false", "--disable-compression", local, f"docker://{remote}"],
            capture_output=True, text=True, timeout=PUSH_SECONDS)
        if done.returncode != 0:
            raise StartError(f"buildah push {local} {remote}: {done.stderr.strip()[-600:]}")

    def remove(self, remote: str) -> None:
        """`remote`'s manifest out of this registry (Distribution's delete API), so that a pull of it
        fails as from a registry that never had it; absent: nothing to do."""
        name, tag = split_tag(remote.removeprefix(f"{ADDRESS}/"))
        url = f"http://{ADDRESS}/v2/{name}/manifests/{tag}"
        head = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
        try:
            with urllib.request.urlopen(head, timeout=30) as answer:
                digest = answer.headers["Docker-Content-Digest"]
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return
            raise
        delete = urllib.request.Request(f"http://{ADDRESS}/v2/{name}/manifests/{digest}", method="DELETE")
        urllib.request.urlopen(delete, timeout=30).close()

    def mirrored(self, image: str) -> str:
        """Where the platform's `image` is in this registry, as the stack's image mirror names it."""
        return mirrored(image, ADDRESS)

    def stop(self) -> None:
        if self.program is not None:
            self.program.stop()
        if self._lock is not None:
            self._lock.close()
