"""SIGTERM ends the trainer's processes, also as a container's first process (PID 1 of its PID
namespace, where the kernel drops the signals a process has no handler for), and also when the main
thread is stuck in C code (common.termination); and a program's exit skips the interpreter's last scan
of its objects (common.cli)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, in_ci, train_args

from common.termination import TERMINATED_EXIT

SETTLE_SECONDS = 3.0  # how long an ignored SIGTERM is given to show it was ignored


def as_pid_one(command: list[str], log: Path) -> subprocess.Popen:
    """`command` as PID 1 of a new PID namespace (as a container's command runs), its output in `log`.
    Unprivileged, a user namespace makes the PID namespace possible."""
    unshare = shutil.which("unshare")
    if unshare is None:
        if in_ci():
            pytest.fail("unshare (util-linux) is missing (CI=true, so not skipped)")
        pytest.skip("unshare (util-linux) is missing")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    with log.open("w") as out:
        return subprocess.Popen([unshare, *user, "--pid", "--net", "--fork", "--kill-child", *command],
                                cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def pid_one_of(unshare: subprocess.Popen) -> int:
    """The host PID of the namespace's first process: unshare's only child."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("unshare started no process")


def wait_for(log: Path, text: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{log.read_text()}"
        time.sleep(0.2)


def in_pause(pid: int, timeout: float = 30) -> None:
    """Waits until the process's main thread sleeps in libc's pause() (x86-64's pause syscall, or the
    ppoll it is made of elsewhere), from the kernel's view of it."""
    deadline = time.monotonic() + timeout
    while not re.search(r"pause|poll", Path(f"/proc/{pid}/task/{pid}/wchan").read_text()):
        assert time.monotonic() < deadline, "the main thread never entered pause()"
        time.sleep(0.01)


def test_python_as_pid_one_without_a_handler_ignores_sigterm(tmp_path):
    """Why the trainer needs a handler: the kernel drops SIGTERM for a PID 1 that has none."""
    sleeper = as_pid_one([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
                         tmp_path / "log")
    try:
        wait_for(tmp_path / "log", "up", sleeper, timeout=30)
        os.kill(pid_one_of(sleeper), signal.SIGTERM)
        time.sleep(SETTLE_SECONDS)
        assert sleeper.poll() is None
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()


def test_a_main_thread_stuck_in_c_code_still_exits_after_the_grace_period(tmp_path):
    """The Python-level handler waits for the main thread to run Python again; a thread that hears the
    signal at once ends the process after the grace period if it never does (SIGTERM is masked in
    the main thread here, so that libc's pause() never returns, as a collective op waits for a lost
    peer)."""
    program = textwrap.dedent("""
        import ctypes, signal
        from common import termination
        termination.exit_on_sigterm("stuck", grace_seconds=0.5)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        print("stuck", flush=True)
        ctypes.CDLL(None).pause()
    """)
    stuck = subprocess.Popen([sys.executable, "-c", program], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert stuck.stdout.readline() == "stuck\n"
    in_pause(stuck.pid)  # not before: a main thread still running Python would run the handler itself
    stuck.send_signal(signal.SIGTERM)
    _, stderr = stuck.communicate(timeout=30)
    assert stuck.returncode == TERMINATED_EXIT
    assert "stuck: still running 0.5 s after SIGTERM; exiting" in stderr


def test_a_program_freezes_its_objects_before_the_interpreters_last_collections():
    """What is alive when atexit's handlers run is never scanned again (gc.freeze): for a TensorFlow
    process, the most of its exit's time."""
    program = textwrap.dedent("""
        import atexit, gc
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
        from common import cli
        cli.run("program", lambda argv: None, [])
    """)
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "frozen at exit: True\n"


@pytest.mark.slow
@pytest.mark.parametrize("module", ["trainer.train", "trainer.parameter_server"])
def test_a_trainer_pod_process_as_pid_one_exits_on_sigterm(module, data_dir, tmp_path):
    """As the kubelet stops a TrainJob's pod: a node training (or a parameter server serving) as PID 1
    ends at SIGTERM, with 143, instead of waiting for SIGKILL at the end of the grace period."""
    if module == "trainer.train":
        args = [*train_args("cnn", data_dir, tmp_path, "--epochs", "500", "--steps-per-epoch", "1")]
        env, ready = {"TF_CONFIG": ""}, "epoch 1/500"
    else:
        args, ready = [], "]: serving at"
        # Inside its own network namespace too: these ports are the test's alone.
        env = {"TF_CONFIG": '{"cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223"], '
                            '"ps": ["localhost:2224"]}, "task": {"type": "ps", "index": 0}}'}
    log = tmp_path / "log"
    command = ["env", *(f"{key}={value}" for key, value in env.items()), sys.executable, "-m", module, *args]
    pod = as_pid_one(command, log)
    try:
        wait_for(log, ready, pod, timeout=240)
        os.kill(pid_one_of(pod), signal.SIGTERM)
        assert pod.wait(timeout=30) == TERMINATED_EXIT, log.read_text()
    finally:
        if pod.poll() is None:
            os.killpg(pod.pid, signal.SIGKILL)
            pod.wait()
