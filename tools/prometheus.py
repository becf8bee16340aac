"""The Prometheus server the tests scrape our model server with (tests/test_autoscaling_prometheus.py):
Debian's `prometheus` package, its binary unpacked into .cache/prometheus/<release>/ (no service
installed or started, no system user: `apt-get download` and `dpkg-deb -x`). Debian stable holds the
upstream release; a different one is an error naming it, so that a change is a decision.

    python -m tools.prometheus      # `make test` runs it; prints the binary's path

Idempotent: a binary already unpacked is kept. When it cannot be had (no apt-get, no package), the
exit status is 1 under CI=true (CI must run every test), else 0 after saying what is missing (the
test then skips, naming the same). Standard library only: it runs before .venv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "prometheus"
# Debian 12 (bookworm) serves 2.42.0+ds-5+deb12u1: the upstream release before "+", Debian's revision after.
RELEASE = "2.42.0"
BINARY = ROOT / ".cache" / "prometheus" / RELEASE / "prometheus"
INSTALL_HINT = "python -m tools.prometheus (Debian's prometheus package: apt-get download, dpkg-deb -x)"
CI_VALUES = {"true", "1", "yes"}
TIMEOUT_SECONDS = 300


class Unavailable(RuntimeError):
    """Prometheus could not be unpacked here; the message says why."""


def run(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)


def download(into: Path) -> Path:
    """Debian's package file, fetched with apt-get (after `apt-get update` if the lists lack it)."""
    if shutil.which("apt-get") is None:
        raise Unavailable("apt-get is not on this machine (the tests use Debian's prometheus package)")
    fetched = run("apt-get", "download", PACKAGE, cwd=into)
    if fetched.returncode != 0:
        updated = run("apt-get", "update")  # a fresh machine may have no package lists yet
        fetched = run("apt-get", "download", PACKAGE, cwd=into)
        if fetched.returncode != 0:
            raise Unavailable(f"apt-get download {PACKAGE} failed: {fetched.stderr.strip()[-300:]} "
                              f"(apt-get update: {updated.stderr.strip()[-200:] or 'ok'})")
    (package,) = into.glob(f"{PACKAGE}_*.deb")
    return package


def unpack() -> Path:
    """The binary, unpacked if it is not yet."""
    if BINARY.is_file():
        return BINARY
    with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as work:
        package = download(Path(work))
        version = package.name.split("_")[1]
        if not version.startswith(f"{RELEASE}+"):
            raise Unavailable(f"Debian serves {PACKAGE} {version}, not release {RELEASE}: check "
                              "tests/test_autoscaling_prometheus.py with it, then set RELEASE here")
        unpacked = run("dpkg-deb", "-x", str(package), str(Path(work) / "root"))
        if unpacked.returncode != 0:
            raise Unavailable(f"dpkg-deb -x {package.name} failed: {unpacked.stderr.strip()[-300:]}")
        BINARY.parent.mkdir(parents=True, exist_ok=True)
        staged = BINARY.with_suffix(".part")
        shutil.copy2(Path(work) / "root" / "usr" / "bin" / PACKAGE, staged)
        os.replace(staged, BINARY)  # whole or not at all
    return BINARY


def main() -> int:
    (ROOT / ".cache").mkdir(exist_ok=True)
    try:
        print(unpack())
    except (Unavailable, OSError, subprocess.SubprocessError) as error:
        in_ci = os.environ.get("CI", "").strip().lower() in CI_VALUES
        print(f"tools.prometheus: {'error' if in_ci else 'warning'}: {error}", file=sys.stderr)
        return 1 if in_ci else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
