"""Builds the tier's programs from the Go module proxy, each in a wrapper module of ours that requires
the upstream module at its pinned version and repeats its `replace` directives (Go ignores a
dependency's replaces; Kubernetes' own go.mod replaces its staging modules with local paths, which
become the `v0.<minor>.<patch>` releases of those modules).

    python -m tools.control_plane.build      # `make test-cluster` (and so `make test`) runs it

Each program is built with `go tool`, which keeps the executable in Go's build cache, outside the
clone: a clean clone on a machine that built them before finds every one in seconds. Prints a line
per program, and writes .cache/control-plane/components.json, which the tier reads.

Under CI=true a missing Go toolchain or an unreachable module proxy fails, naming it; elsewhere the
build says so and exits 0, and the tier's tests skip naming it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from tools.control_plane import components
from tools.control_plane.components import ROOT, Component

CACHE = ROOT / ".cache" / "control-plane"
MANIFEST = CACHE / "components.json"
# The tier's caches outside the clone, which every clone on the machine shares: the images' build
# contexts, the real node's image store, the registry's store.
MACHINE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dist-ml"
WRAPPER_PREFIX = "dist-ml.local/control-plane/"
GO_TIMEOUT_SECONDS = 3600
CI_VALUES = {"true", "1", "yes"}
UNREACHABLE = re.compile(
    r"dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout|"
    r"network is unreachable"
)
NOT_SERVED = re.compile(r"not available|404 Not Found|403 Forbidden|unknown revision|invalid version")
# A module's go.mod replacing a module with a local path (its own repository's copy) — for Kubernetes,
# its staging modules, required as v0.0.0.
STAGING_VERSION = "v0.0.0"
KUBERNETES = "k8s.io/kubernetes"


class Unavailable(RuntimeError):
    """Go or the module proxy cannot be reached here; the message names which."""


class BuildError(RuntimeError):
    """A component did not build; the message ends with Go's own words."""


@dataclasses.dataclass(frozen=True)
class Built:
    """A component as the tier runs it: its version, why, its programs' paths, its module's files."""

    name: str
    module: str
    version: str
    pinned: str  # the version the stacks install
    pinned_by: str
    module_dir: str  # the module's source in Go's module cache (CRDs, webhook manifests, charts)
    binaries: dict[str, str]  # main package -> executable

    @property
    def note(self) -> str:
        if self.version == self.pinned:
            return ""
        why = components.SUBSTITUTES.get(self.name, f"the module proxy serves no {self.pinned}")
        return f"the stacks install {self.pinned}; {why}: the tier runs {self.version}"


def go_env() -> dict[str, str]:
    # Go's own toolchain only (no toolchain download), no workspace file of the user's; the modules the
    # checksum database lacks are checked by download() against the hash their consumer records.
    unchecked = [os.environ.get("GONOSUMDB", ""),
                 *(module.partition("@")[0] for module in components.RECORDED_SUMS)]
    return {**os.environ, "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-mod=mod",
            "GONOSUMDB": ",".join(filter(None, unchecked))}


def go(*args: str, cwd: Path = CACHE, static: bool = False, env: dict[str, str] | None = None) -> str:
    if shutil.which("go") is None:
        raise Unavailable("go is not on PATH (the tier builds its programs with Go from the module proxy)")
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["go", *args], cwd=cwd, env={**go_env(), **({"CGO_ENABLED": "0"} if static else {}), **(env or {})},
        capture_output=True, text=True, timeout=GO_TIMEOUT_SECONDS
    )
    if done.returncode != 0:
        words = done.stderr.strip() or done.stdout.strip()  # `go mod download -json` reports in its JSON
        if UNREACHABLE.search(words):
            raise Unavailable(f"the Go module proxy ({proxy()}) cannot be reached: {last_lines(words)}")
        raise BuildError(f"go {' '.join(args)}: {last_lines(words)}")
    return done.stdout


def proxy() -> str:
    return subprocess.run(["go", "env", "GOPROXY"], capture_output=True, text=True).stdout.strip()


def last_lines(text: str, count: int = 6) -> str:
    return " | ".join(text.splitlines()[-count:])


def disk_bytes(path: Path) -> int:
    """What `path` takes on the disk, as `du -s` counts it: its files' blocks, each inode once."""
    seen, total = set(), 0
    for directory, _, files in os.walk(path):
        for name in [".", *files]:
            try:
                found = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:  # gone while this walks
                continue
            if (found.st_dev, found.st_ino) not in seen:
                seen.add((found.st_dev, found.st_ino))
                total += found.st_blocks * 512
    return total


def held_alone(store: Path) -> TextIO | None:
    """`store` (one of MACHINE_CACHE's, which one tier on the machine at a time holds) made, and held
    for this process until the returned lock file is closed; None when another process holds it."""
    store.mkdir(parents=True, exist_ok=True)
    lock = (store.parent / f"{store.name}.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def shown_bytes(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def download(module: str, version: str) -> dict:
    """The module's source in the module cache (go mod download -json): Dir, GoMod, Version. A module
    the checksum database lacks must have the hash components.RECORDED_SUMS holds for it."""
    found = json.loads(go("mod", "download", "-json", f"{module}@{version}"))
    recorded = components.RECORDED_SUMS.get(f"{module}@{version}")
    if recorded is not None and found.get("Sum") != recorded:
        raise BuildError(f"{module}@{version}: the module proxy's zip hashes to {found.get('Sum')}, and its "
                         f"consumer's go.sum records {recorded}: not built")
    return found


def served_version(module: str, pinned: str) -> str:
    """`pinned` if the proxy serves it, else the newest version it serves before `pinned` (same major)."""
    try:
        download(module, pinned)
        return pinned
    except BuildError as error:
        if not NOT_SERVED.search(str(error)):
            raise
    listed = go("list", "-m", "-versions", module).split()[1:]
    older = [
        version
        for version in listed
        if semver(version) < semver(pinned) and semver(version)[0] == semver(pinned)[0] and "-" not in version
    ]
    if not older:
        raise BuildError(
            f"{module}: the module proxy serves neither {pinned} nor an earlier release of its "
            f"major version (it lists {' '.join(listed) or 'none'})"
        )
    return max(older, key=semver)


def is_served(module: str, version: str) -> bool:
    try:
        download(module, version)
        return True
    except BuildError as error:
        if not NOT_SERVED.search(str(error)):
            raise
        return False


def version_to_build(component: Component, pinned: str) -> str:
    """The version of `component` the tier builds: `pinned`, or where the proxy does not serve it the
    newest one before it, if components.SUBSTITUTES declares the component, or outside CI (said in the
    tier's log); under CI=true an error naming it."""
    declared = components.SUBSTITUTE_VERSIONS.get(component.name)
    version = served_version(component.served_module, pinned) if declared is None else None
    if version is None:  # a declared substitute: the pin when the proxy serves it, else that version
        version = pinned if is_served(component.served_module, pinned) else declared
    if version != pinned and component.name not in components.SUBSTITUTES and in_ci():
        raise BuildError(
            f"{component.name}: the module proxy serves no {component.served_module}@{pinned} "
            f"({component.pinned_by}'s version); under CI=true the tier runs no other version ({version} is "
            "the newest it serves before it) unless tools/control_plane/components.py SUBSTITUTES declares "
            "the component, with why"
        )
    return version


def semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-")[0])[:3])


def upstream_go_mod(module: str, version: str) -> tuple[dict, str]:
    """The upstream go.mod, parsed by Go (go mod edit -json), and the module's directory."""
    found = download(module, version)
    return json.loads(go("mod", "edit", "-json", found["GoMod"])), found["Dir"]


def mirrored_replaces(upstream: dict, version: str) -> list[str]:
    """Upstream's replace directives as lines of ours. A replacement by a local path (the upstream
    repository's own copy) of a module it requires as v0.0.0 becomes the release the proxy serves for
    it: Kubernetes' staging modules are released as v0.<minor>.<patch> with k8s.io/kubernetes
    v1.<minor>.<patch>. A local replacement of a module required at a real version (etcd's own
    modules) or not at all changes nothing outside its repository, and is left out."""
    required = {item["Path"]: item["Version"] for item in upstream.get("Require") or []}
    lines = []
    for replace in upstream.get("Replace") or []:
        old, new = replace["Old"], replace["New"]
        source = old["Path"] + (f" {old['Version']}" if old.get("Version") else "")
        if new.get("Version"):
            lines.append(f"{source} => {new['Path']} {new['Version']}")
        elif required.get(old["Path"]) == STAGING_VERSION:
            major, minor, patch = semver(version)
            lines.append(f"{source} => {old['Path']} v0.{minor}.{patch}")
    return lines


def wrapper_go_mod(component: Component, upstream: dict, source: Path | None = None) -> str:
    """Our module: the upstream module at its version (from `source`, a copy, if given), its replaces,
    and its commands as tools."""
    replaces = [*mirrored_replaces(upstream, component.version), *component.replaces]
    if source is not None:
        replaces.append(f"{component.module} {component.version} => {source}")
    lines = [
        f"// Generated by tools/control_plane/build.py: {component.module} {component.version} and its",
        "// replace directives, for the control-plane tier. Not edited by hand.",
        f"module {WRAPPER_PREFIX}{component.name}",
        "",
        f"go {upstream['Go']}",
        "",
        f"require {component.module} {component.version}",
        "",
    ]
    if replaces:
        lines += ["replace (", *(f"\t{line}" for line in replaces), ")", ""]
    lines += ["tool (", *(f"\t{command}" for command in component.commands), ")"]
    return "\n".join(lines) + "\n"


def prepare(component: Component) -> tuple[Path, str]:
    """The wrapper module's directory, tidied when its go.mod is new or changed, and the module's source."""
    upstream, module_dir = upstream_go_mod(component.served_module, component.version)
    directory = CACHE / "modules" / f"{component.name}-{component.version}"
    directory.mkdir(parents=True, exist_ok=True)
    source = source_copy(component, Path(module_dir)) if component.copied else None
    text = wrapper_go_mod(component, upstream, source)
    go_mod, stamp = directory / "go.mod", directory / "go.mod.generated"
    if not stamp.is_file() or stamp.read_text() != text:
        go_mod.write_text(text)
        (directory / "go.sum").unlink(missing_ok=True)
        go("mod", "tidy", cwd=directory)
        stamp.write_text(text)
    return directory, module_dir


def source_copy(component: Component, module_dir: Path) -> Path:
    """A copy of the module as upstream's build has it before it compiles: its symbolic links restored,
    the files its build makes, the modules of its repository its go.mod replaces by a relative path laid
    out beside it, its code generated. Outside the clone beside the stamped binaries (one path on the
    machine, so Go's build cache serves every clone); made again when the recipe changes."""
    base = stamped_binaries_dir(component).parent / "sources" / f"{component.name}-{component.version}"
    source = base / "module"
    stamp = base / ".dist-ml-copy"
    wanted = json.dumps([component.links, component.files, component.siblings, component.generate,
                         component.generate_env])
    if stamp.is_file() and stamp.read_text() == wanted:
        return source
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    copy_tree(module_dir, source)
    for path, target in component.links:
        (source / path).symlink_to(target)
    for path, content in component.files:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(content)
    for relative, module, version in component.siblings:
        copy_tree(Path(download(module, version)["Dir"]), (source / relative).resolve())
    for package in component.generate:
        go("generate", f"./{package}", cwd=source, env=dict(component.generate_env))
    stamp.write_text(wanted)
    return source


def copy_tree(module_dir: Path, target: Path) -> None:
    # The module cache's files and directories are read-only; the copy's are the user's own.
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-R", "--no-preserve=mode", str(module_dir), str(target)], check=True)


def stamped_binaries_dir(component: Component) -> Path:
    cache = Path(subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True).stdout.strip())
    return cache.parent / "dist-ml-control-plane" / f"{component.name}-{component.version}"


def build_command(directory: Path, component: Component, command: str) -> str:
    """The executable of `command`, from Go's build cache (built there first if it is not); a program
    upstream stamps with its release (`go tool` takes no -ldflags) is built with `go build` into a
    directory beside Go's cache, outside the clone, where an up-to-date one is not linked again."""
    if not component.ldflags:
        return go("tool", "-n", command, cwd=directory, static=component.static).strip()
    output = stamped_binaries_dir(component) / program_name(component.name, command)
    go("build", f"-ldflags={component.stamps()}", "-o", str(output), command, cwd=directory,
       static=component.static)
    return str(output)


def program_name(component: str, command: str) -> str:
    """The program's name: its main package's last path element, or its component's name where that is
    a major version (go.etcd.io/etcd/server/v3)."""
    name = command.rpartition("/")[2]
    return component if re.fullmatch(r"v[0-9]+", name) else name


def build_component(component: Component, pinned: str, say=print) -> Built:
    if not component.commands:  # read, not built: its charts, its CRDs
        module_dir = download(component.served_module, component.version)["Dir"]
        return Built(component.name, component.module, component.version, pinned, component.pinned_by,
                     module_dir, {})
    directory, module_dir = prepare(component)
    binaries = {}
    for command in component.commands:
        started = time.monotonic()
        program = program_name(component.name, command)
        say(f"control-plane: {program} ({component.name} {component.version}) ...")
        binaries[command] = build_command(directory, component, command)
        say(f"control-plane: {program} ready in {time.monotonic() - started:.0f} s")
    return Built(
        component.name, component.module, component.version, pinned, component.pinned_by, module_dir, binaries
    )


def build_all(say=print) -> list[Built]:
    """Every component, in the order the tier starts them, so that the first tests' needs come first."""
    pins = components.pins()
    built: list[Built] = []

    def add(make, pinned: str) -> None:
        version = version_to_build(make(pinned), pinned)
        built.append(build_component(make(version), pinned, say))

    add(components.kubernetes, pins.kubernetes)
    kubernetes_mod, _ = upstream_go_mod("k8s.io/kubernetes", pins.kubernetes)
    required = {item["Path"]: item["Version"] for item in kubernetes_mod["Require"]}
    add(components.etcd, required["go.etcd.io/etcd/client/v3"])
    add(components.kwok, components.KWOK_VERSION)
    add(components.helm, components.HELM_VERSION)
    add(components.trainer, pins.trainer)
    add(components.jobset, components.jobset_version(Path(built[-1].module_dir)))
    add(components.kueue, pins.kueue)
    kueue_mod, _ = upstream_go_mod(components.kueue(built[-1].version).served_module, built[-1].version)
    add(components.autoscaler_apis, {item["Path"]: item["Version"] for item in kueue_mod["Require"]}[
        components.AUTOSCALER_APIS])
    add(components.argo, pins.argo)
    argo = built[-1]  # its executor and server: from the module of the controller the tier runs
    built += [build_component(make(argo.version), pins.argo, say) for make in (components.argoexec,
                                                                                components.argocli)]
    add(components.kserve, pins.kserve)
    add(components.kserve_agent, pins.kserve)
    add(components.kube_rbac_proxy, components.kserve_rbac_proxy_version(Path(built[-1].module_dir)))
    add(components.keda, pins.keda)
    add(components.coredns, components.kubeadm_constant(Path(built[0].module_dir), "CoreDNSVersion"))
    add(components.local_path_provisioner, components.LOCAL_PATH_VERSION)
    add(components.kube_router, components.KUBE_ROUTER_VERSION)
    add(components.registry, components.REGISTRY_VERSION)
    add(components.cert_manager, pins.cert_manager)
    add(components.prometheus_operator, components.PROMETHEUS_OPERATOR_VERSION)
    add(components.pulumi, components.locked_version(components.PULUMI_SDK))
    pinned = components.locked_version(components.PULUMI_KUBERNETES_SDK)
    version = version_to_build(components.pulumi_kubernetes(pinned, sdk_version=""), pinned)
    built.append(build_component(provider_with_its_sdk(version), pinned, say))
    return built


def provider_with_its_sdk(version: str) -> Component:
    """Pulumi's Kubernetes provider at `version`, with the Go SDK its go.mod requires beside it."""
    upstream, _ = upstream_go_mod(components.PULUMI_KUBERNETES_MODULE, version)
    required = {item["Path"]: item["Version"] for item in upstream["Require"]}
    return components.pulumi_kubernetes(version, required[components.PULUMI_KUBERNETES_SDK_MODULE])


def write_manifest(built: list[Built]) -> None:
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(
        json.dumps([{**dataclasses.asdict(item), "note": item.note} for item in built], indent=2) + "\n"
    )


def read_manifest() -> list[Built]:
    fields = {field.name for field in dataclasses.fields(Built)}
    return [
        Built(**{key: value for key, value in item.items() if key in fields})
        for item in json.loads(MANIFEST.read_text())
    ]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def main() -> None:
    started = time.monotonic()
    try:
        built = build_all()
    except Unavailable as missing:
        MANIFEST.unlink(missing_ok=True)
        print(f"control-plane: cannot build the tier: {missing}", file=sys.stderr)
        sys.exit(1 if in_ci() else 0)
    except (BuildError, components.PinError) as error:
        MANIFEST.unlink(missing_ok=True)
        sys.exit(f"control-plane: {error}")
    write_manifest(built)
    print(
        f"control-plane: {sum(len(item.binaries) for item in built)} programs of {len(built)} components "
        f"ready in {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
