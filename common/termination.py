"""Ending on SIGTERM when run as a container's first process.

The kubelet stops a pod with SIGTERM, then SIGKILL after the grace period (30 s by default). A
container's command runs as PID 1 of its PID namespace, and the kernel delivers PID 1 only the
signals it has a handler for: Python installs none for SIGTERM, so a trainer ignored it and every
JobSet restart, and every parameter-server job's end, waited out the grace period. With
`exit_on_sigterm`, SIGTERM raises SystemExit in the main thread (finally blocks and atexit run); if
the main thread is inside TensorFlow's C++ (a collective waiting for a peer that is gone) and does
not return to Python within the grace below, a watcher thread ends the process itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

TERMINATED_EXIT = 128 + signal.SIGTERM  # 143: the status a shell reports for a process SIGTERM ended
# How long the main thread has to reach Python after SIGTERM before the process ends without it:
# well inside Kubernetes' default 30 s grace period, long enough for an epoch's backup write to finish.
FORCED_EXIT_SECONDS = 10.0


def _raise_exit(_signum: int, _frame: object) -> None:
    raise SystemExit(TERMINATED_EXIT)


def _exit_after_grace(wakeup: int, grace_seconds: float, prog: str) -> None:
    # Python's C-level handler writes each handled signal's number to the wakeup fd at once, even while
    # the main thread is blocked in C code and the Python-level handler cannot run yet.
    while os.read(wakeup, 1) != bytes([signal.SIGTERM]):
        pass
    time.sleep(grace_seconds)
    print(f"{prog}: still running {grace_seconds:g} s after SIGTERM; exiting", file=sys.stderr, flush=True)
    os._exit(TERMINATED_EXIT)


def exit_on_sigterm(prog: str, grace_seconds: float = FORCED_EXIT_SECONDS) -> None:
    """SIGTERM ends this process (status 143), as PID 1 too; call once, from the main thread."""
    signal.signal(signal.SIGTERM, _raise_exit)
    wakeup, notify = os.pipe()
    os.set_blocking(notify, False)
    signal.set_wakeup_fd(notify, warn_on_full_buffer=False)
    threading.Thread(target=_exit_after_grace, args=(wakeup, grace_seconds, prog), daemon=True,
                     name="sigterm-watch").start()
