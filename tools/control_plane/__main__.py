"""The control-plane tier's commands.

    python -m tools.control_plane test [PYTEST ARGS]   # build, then run tests/cluster/ (make test-cluster)
    python -m tools.control_plane up                   # build, start the tier, wait for Ctrl-C

Both run inside a network and mount namespace of their own (util-linux `unshare`; unprivileged users
get a user namespace too): the tier binds fixed ports, pods get addresses on a bridge no other
namespace sees, and nothing inside can reach any address outside. `up` prints how to enter it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tools.control_plane import build
from tools.control_plane.cluster import NAMESPACE_ENV

TESTS = "tests/cluster"
PLUGIN = "tools.control_plane.pytest_plugin"


def unshare_command() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise build.Unavailable(
            "util-linux's unshare is not on PATH (the tier runs in namespaces of its own)"
        )
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--net", "--mount", "--propagation", "private", "--fork", "--kill-child"]


def in_namespaces(*command: str) -> int:
    """`command` in a new network and mount namespace, after tools.control_plane.inside set them up."""
    return subprocess.call(
        [*unshare_command(), sys.executable, "-m", "tools.control_plane.inside", *command],
        env={**os.environ, NAMESPACE_ENV: "1"},
        cwd=build.ROOT,
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("test", "up"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        built = build.build_all()
    except build.Unavailable as missing:
        if build.in_ci():
            print(
                f"control-plane: cannot build the tier (CI=true, so this fails): {missing}", file=sys.stderr
            )
            return 1
        print(f"control-plane: skipped: {missing}", file=sys.stderr)
        return 0
    except (build.BuildError, build.components.PinError) as error:
        print(f"control-plane: {error}", file=sys.stderr)
        return 1
    build.write_manifest(built)
    if argv[0] == "test":
        return in_namespaces(sys.executable, "-m", "pytest", TESTS, "-p", "no:xdist", "-p", PLUGIN, *argv[1:])
    return in_namespaces(sys.executable, "-m", "tools.control_plane.up")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
