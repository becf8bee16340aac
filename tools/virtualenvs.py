"""The virtualenvs in which the tests run users' paths (tests/test_environments.py and
tests/test_image_environments.py): the policy pack's, `pip install '.[infra]'`'s, and each image's lock
installed as its Dockerfile installs it (`--no-deps -r`). Each is a real virtualenv from the package
registry (installed by uv, tools/uv.py), kept under .cache/envs/ by the digest of what it installs,
so a run after the first reuses it.

    python -m tools.virtualenvs     # builds any missing (`make test` runs it in the background)

Standard library only, so that it runs before .venv exists: an install keeps about one core busy,
so `make test` builds these in the background, one at a time, beside the dev virtualenv's install and
then the tests, and a test that needs one waits for it (docs/results/index.md#the-test-suite).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from tools.lock import IMAGES, LOCK_DIR, ROOT
from tools.uv import Unavailable, uv

ENVS_DIR = ROOT / ".cache" / "envs"
POLICY_DIR = ROOT / "policy"  # the policy pack, run by `pulumi preview --policy-pack policy`
POLICY_REQUIREMENTS = POLICY_DIR / "requirements.txt"
INSTALL_TIMEOUT_SECONDS = 1200
READY_MARKER = ".installed"


class BuildError(RuntimeError):
    """A virtualenv could not be built; the message ends with the installer's own."""


def digest(*paths: Path) -> str:
    hashed = hashlib.sha256()
    for path in paths:
        hashed.update(path.read_bytes())
    return hashed.hexdigest()[:16]


def virtualenv(name: str, key: str, *install_args: str, cwd: Path = ROOT) -> Path:
    """A virtualenv with `install_args` installed, built once per key; returns its python. While
    another process builds it (`make test`'s background build, another test worker), waits for it."""
    home = ENVS_DIR / f"{name}-{key}"
    ENVS_DIR.mkdir(parents=True, exist_ok=True)
    with open(ENVS_DIR / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / READY_MARKER).is_file():
            build(home, install_args, cwd)
    return home / "bin" / "python"


def build(home: Path, install_args: tuple[str, ...], cwd: Path) -> None:
    """`python -m venv` (pip inside, for the tests' `pip check`), the packages installed by uv: the
    same ones pip installs, in a third of its CPU time (tools/uv.py)."""
    try:
        installer = str(uv())
    except Unavailable as error:
        raise BuildError(f"{home.name}: {error}") from None
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
    result = subprocess.run([installer, "pip", "install", "--quiet", "--compile-bytecode",
                             "--python", str(home / "bin" / "python"), *install_args],
                            cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
    if result.returncode != 0:
        raise BuildError(f"{home.name}: uv pip install {' '.join(install_args)}:\n{result.stderr[-3000:]}")
    (home / READY_MARKER).touch()


def checkout_copy(destination: Path) -> Path:
    """A user's checkout: the files git tracks, as the working tree has them."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def policy_python() -> Path:
    """The policy pack's virtualenv, as Pulumi builds it: policy/requirements.txt alone."""
    return virtualenv("policy", digest(POLICY_REQUIREMENTS), "-r", str(POLICY_REQUIREMENTS))


def infra_python(checkout: Path) -> Path:
    """`pip install '.[infra]'` run in `checkout`, a copy of the checkout (the project built from it)."""
    return virtualenv("infra", digest(ROOT / "pyproject.toml"), ".[infra]", cwd=checkout)


def image_python(image: str) -> Path:
    """The image's lock installed as its Dockerfile installs it (`--no-deps -r`: the lock alone)."""
    requirements = LOCK_DIR / f"{image}.txt"
    return virtualenv(image, digest(requirements), "--no-deps", "-r", str(requirements))


def build_infra() -> Path:
    with tempfile.TemporaryDirectory(prefix="infra-checkout-") as checkout:
        return infra_python(checkout_copy(Path(checkout)))


# The largest first. One at a time: two beside the dev install took as long in all (the machine's two
# cores are busy either way) and held the tests back until all were done.
BUILDS: dict[str, Callable[[], Path]] = {
    **{image: (lambda image=image: image_python(image)) for image in IMAGES},
    "infra": build_infra,
    "policy": policy_python,
}


def main() -> None:
    for name, build_one in BUILDS.items():
        started = time.monotonic()
        try:
            build_one()
        except BuildError as error:
            sys.exit(f"tools.virtualenvs: error: {error}")
        print(f"tools.virtualenvs: {name} ready ({time.monotonic() - started:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
