"""The installer of the dev virtualenv and of the tests' virtualenvs: uv, pinned, in its own small
virtualenv under .cache/ (pip-installed from the registry once). It installs the same pinned packages
pip does, from one download cache, in a third of the CPU time pip takes on this project's locks (the
TensorFlow lock: 45 CPU-seconds cold, 28 warm, against pip's 80; docs/results/index.md#the-test-suite),
and `make test` spends a fifth of its run installing. Users' images still install with pip.

    python -m tools.uv      # prints uv's path (the Makefile's install and tools.virtualenvs call it)

Standard library only: it runs before .venv exists, beside tools.virtualenvs (a lock file keeps two
callers from building it twice).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.13.9"
HOME = ROOT / ".cache" / f"uv-{VERSION}"
BINARY = HOME / "bin" / "uv"
TIMEOUT_SECONDS = 300


class Unavailable(RuntimeError):
    """uv could not be installed; the message ends with pip's own."""


def uv() -> Path:
    """uv's binary, installed on the first call."""
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / f"{HOME.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not BINARY.is_file():
            install()
    return BINARY


def install() -> None:
    shutil.rmtree(HOME, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(HOME)], check=True, timeout=120)
    pip = [str(HOME / "bin" / "python"), "-m", "pip", "install", "--quiet", f"uv=={VERSION}"]
    result = subprocess.run(pip, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    if result.returncode != 0 or not BINARY.is_file():
        shutil.rmtree(HOME, ignore_errors=True)
        raise Unavailable(f"pip install uv=={VERSION}:\n{result.stderr[-3000:]}")


def main() -> None:
    try:
        print(uv())
    except Unavailable as error:
        sys.exit(f"tools.uv: error: {error}")


if __name__ == "__main__":
    main()
