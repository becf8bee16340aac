"""The control-plane tier's commands.

    python -m tools.control_plane test [PYTEST ARGS]   # build, then run tests/cluster/ (make test-cluster)
    python -m tools.control_plane e2e [PYTEST ARGS]    # build, then tests/e2e_node/ (make test-e2e)
    python -m tools.control_plane all                  # build once, then both side by side (make test)
    python -m tools.control_plane up                   # build, start the tier, wait for Ctrl-C

Both run inside a network and mount namespace of their own (util-linux `unshare`; unprivileged users
get a user namespace too): the tier binds fixed ports, pods get addresses on a bridge no other
namespace sees, and nothing inside can reach any address outside. `up` prints how to enter it.

Each keeps what it makes in a directory of its own (tier_directory), emptied but for its logs when it
ends, once its namespaces are gone and their mounts with them.
"""

from __future__ import annotations

import concurrent.futures
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.control_plane import build
from tools.control_plane.cluster import NAMESPACE_ENV
from tools.control_plane.nodes import images

# Each in a tier of its own: the end-to-end run takes the real node as the cluster's one node, the
# others keep KWOK's simulated pods. Only the real node runs the images.
TESTS = {"test": "tests/cluster", "e2e": "tests/e2e_node"}
NEEDS_IMAGES = {"e2e", "all"}
PLUGIN = "tools.control_plane.pytest_plugin"
LOGS = build.CACHE  # `all`: each tier's output, printed when both end
# This checkout's tiers' run directories, in the machine's temporary directory, not the clone: the
# kubelet's and containerd's unix sockets are in them, whose paths may not pass 107 bytes.
TIERS = Path(tempfile.gettempdir()) / f"dist-ml-{hashlib.sha256(str(build.ROOT).encode()).hexdigest()[:8]}"
# What a user reads after a run, kept when its directory is emptied (docs/development.md): the
# programs', the pods' and the tests' logs, and the scaling test's Prometheus targets.
KEPT_AFTER_A_RUN = ("*.log", "targets.json")


def log_of(name: str) -> Path:
    """Where `all` keeps the output of one tier's tests: cluster.log, e2e_node.log."""
    return LOGS / f"{Path(TESTS[name]).name}.log"


def tier_directory(name: str) -> Path:
    """Where one run of `name` (test, e2e, up) keeps what it makes, its pytest's basetemp: TIERS'
    cluster, e2e_node or up. Its next run starts it anew."""
    return TIERS / (Path(TESTS[name]).name if name in TESTS else name)


def emptied_but_logs(directory: Path) -> tuple[int, list[str]]:
    """Every file under `directory` removed but what a user reads after a run (KEPT_AFTER_A_RUN), and
    the directories left empty: the bytes freed, and what could not be removed (with why)."""
    freed, left = 0, []
    for parent, directories, files in os.walk(directory, topdown=False):
        for name in files:
            if any(fnmatch.fnmatch(name, kept) for kept in KEPT_AFTER_A_RUN):
                continue
            path = Path(parent, name)
            try:
                size = path.lstat().st_blocks * 512
                path.unlink()
                freed += size
            except OSError as error:
                left.append(f"{path}: {error.strerror}")
        for name in directories:
            path = Path(parent, name)
            try:
                if path.is_symlink():
                    path.unlink()
                elif not any(path.iterdir()):
                    path.rmdir()
            except OSError as error:
                left.append(f"{path}: {error.strerror}")
    return freed, left


def finished(name: str, status: int) -> int:
    """`status`, once the run's directory is emptied but for its logs, saying so (and what stayed)."""
    directory = tier_directory(name)
    if directory.is_dir():
        freed, left = emptied_but_logs(directory)
        stayed = f"; {len(left)} could not be removed, as {left[0]}" if left else ""
        print(f"control-plane: {directory.name}: removed its run's state ({build.shown_bytes(freed)})"
              f"{stayed}; its logs stay in {directory}", flush=True)
    return status


def unshare_command() -> list[str]:
    """unshare's command for the tier's namespaces; Unavailable when this machine cannot make them."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise build.Unavailable(
            "util-linux's unshare is not on PATH (the tier runs in namespaces of its own)"
        )
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    command = [unshare, *user, "--net", "--mount", "--propagation", "private", "--fork", "--kill-child"]
    tried = subprocess.run([*command, "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        raise build.Unavailable(f"cannot make a network and mount namespace here: {tried.stderr.strip()}")
    return command


def in_namespaces(*command: str, output=None) -> subprocess.Popen:
    """`command` started in a new network and mount namespace, after tools.control_plane.inside set
    them up (TIERS made first: pytest makes its basetemp, not its parent)."""
    TIERS.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*unshare_command(), sys.executable, "-m", "tools.control_plane.inside", *command],
        env={**os.environ, NAMESPACE_ENV: "1"},
        cwd=build.ROOT,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
    )


def waited(*runs: subprocess.Popen) -> list[int]:
    """Their exit statuses; every one killed (and its tier with it: unshare --kill-child) if this
    process is interrupted while it waits."""
    try:
        return [run.wait() for run in runs]
    except BaseException:
        for run in runs:
            run.kill()
        raise


def pytest_command(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", TESTS[name], "-p", "no:xdist", "-p", PLUGIN,
            f"--basetemp={tier_directory(name)}", *args]


def side_by_side() -> int:
    """tests/cluster/ and tests/e2e_node/ at once, each in a tier of its own: most of each one's time
    is waiting on its controllers and pods, which the other fills. Each one's output is printed whole
    when both have ended."""
    LOGS.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in TESTS:
        with log_of(name).open("w") as log:
            runs.append(in_namespaces(*pytest_command(name), output=log))
    statuses = {name: finished(name, status) for name, status in zip(TESTS, waited(*runs))}
    for name in TESTS:
        print(f"--- python -m tools.control_plane {name} (exit status {statuses[name]}) ---", flush=True)
        sys.stdout.write(log_of(name).read_text())
    return 0 if not any(statuses.values()) else 1


def unavailable(missing: build.Unavailable) -> int:
    """Exit status 1 under CI=true (CI must run every test), else 0 after saying what is missing."""
    if build.in_ci():
        print(f"control-plane: cannot run the tier (CI=true, so this fails): {missing}", file=sys.stderr)
        return 1
    print(f"control-plane: skipped: {missing}", file=sys.stderr)
    return 0


def write_node_images(base: concurrent.futures.Future, programs: list[build.Built]) -> None:
    """The real node's images' manifest, once they are all built: those built beside the Go build
    (`base`), then the platform's from its `programs`; then buildah's storage pruned of what no
    checkout uses any more. Without buildah and its kin (or PyPI) the node's tests skip, saying why, and
    the rest of the tier runs; under CI=true it fails like a missing Go."""
    try:
        built = [*base.result(), *images.program_images(programs)]
        images.write_manifest(built)
        images.write_in_use([image.name for image in built])
        images.prune()
    except build.Unavailable as missing:
        if build.in_ci():
            raise
        print(f"control-plane: the real node's tests will skip: {missing}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in (*TESTS, "all", "up") or (argv[0] == "all" and argv[1:]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        # The images' builds wait mostly on PyPI and the disk, the Go builds on the cores: side by side.
        images.MANIFEST.unlink(missing_ok=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as beside:
            base = beside.submit(images.build_images) if argv[0] in NEEDS_IMAGES else None
            built = build.build_all()
            build.write_manifest(built)
        if base is not None:
            write_node_images(base, built)
        if argv[0] == "all":
            return side_by_side()
        if argv[0] in TESTS:
            return finished(argv[0], *waited(in_namespaces(*pytest_command(argv[0], *argv[1:]))))
        up = in_namespaces(sys.executable, "-m", "tools.control_plane.up", str(tier_directory("up")))
        return finished("up", *waited(up))
    except build.Unavailable as missing:
        return unavailable(missing)
    except (build.BuildError, build.components.PinError) as error:
        print(f"control-plane: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
