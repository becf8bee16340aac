"""The first process of the tier's own network and mount namespaces: sets them up, then runs the given
command in them (`python -m tools.control_plane test|up` runs it in namespaces it has just made).

    python -m tools.control_plane.inside COMMAND [ARG ...]

- loopback up, and the bridge the pods' network namespaces attach to (no uplink: nothing in the tier
  reaches an address outside it, and nothing outside reaches in);
- /etc overlaid with a layer of the tier's own: Kueue reads its metrics certificate from a fixed path
  under /etc (v0.19.2 cmd/kueue/main.go, when its own certificate management is off), which the
  tier writes there without touching the machine's /etc.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tools.control_plane.cluster import BRIDGE, BRIDGE_ADDRESS, BRIDGE_PREFIX

SCRATCH = "/mnt"  # a tmpfs in this mount namespace only, holding the /etc layer


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


def set_up() -> None:
    run("ip", "link", "set", "lo", "up")
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/{BRIDGE_PREFIX}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    run("mount", "-t", "tmpfs", "tier-scratch", SCRATCH)
    upper, work = f"{SCRATCH}/etc-upper", f"{SCRATCH}/etc-work"
    os.makedirs(upper)
    os.makedirs(work)
    run("mount", "-t", "overlay", "tier-etc", "-o", f"lowerdir=/etc,upperdir={upper},workdir={work}", "/etc")


def main(command: list[str]) -> None:
    try:
        set_up()
    except subprocess.CalledProcessError as error:
        sys.exit(
            f"control-plane: could not set up the tier's namespaces: {' '.join(error.cmd)}: "
            f"{error.stderr.strip()}"
        )
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
