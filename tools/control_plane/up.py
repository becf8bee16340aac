"""Inside the tier's namespaces (`python -m tools.control_plane up` runs it there): starts the tier for
the local stack in DIRECTORY (made anew), prints how to reach it, and keeps it up until Ctrl-C (or
SIGTERM).

    python -m tools.control_plane.up DIRECTORY
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import NoReturn

from tools.control_plane.build import read_manifest
from tools.control_plane.stacks import local_config, local_stack
from tools.control_plane.tier import Tier


def interrupt(_signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM stops the tier as Ctrl-C does


def main(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rendered = local_stack()
    tier = Tier(directory, read_manifest(), local_config().cluster.name)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        tier.start(rendered)
        kubectl = tier.kubernetes.binaries["kubectl"]
        print(
            f"control-plane: up; logs in {directory / 'logs'}. From another shell:\n"
            f"  nsenter --target {os.getpid()} --net --mount {kubectl} --kubeconfig {tier.admin} get pods -A",
            flush=True,
        )
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        tier.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
