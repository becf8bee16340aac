"""Command-line plumbing shared by every package's entry points: every failure is one clear line."""

from __future__ import annotations

import argparse
import atexit
import gc
import math
import re
import sys
from typing import Callable, NoReturn, Sequence, TypeVar

Number = TypeVar("Number", int, float)
# The exit code of a cluster step the cluster told, in its own words, that what it waits for will never
# happen (NeverSucceeds): the step templates' retryStrategy does not retry it (pipeline/argo.py), since
# another attempt would meet the same answer, so the step ends within a minute of its start.
NEVER_SUCCEEDS_EXIT_CODE = 3


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class NeverSucceeds(Exception):
    """Mixed into a step's error when the cluster said what the step waits for will never happen (a
    pod that cannot start, a probe that cannot pass, a job refused): retrying the step cannot help."""


def step_exit(prefix: str, error: Exception) -> SystemExit:
    """How a cluster step ends on `error`: its one line on stderr, and NEVER_SUCCEEDS_EXIT_CODE when no
    retry can help."""
    print(f"{prefix}: {error}", file=sys.stderr, flush=True)
    return SystemExit(NEVER_SUCCEEDS_EXIT_CODE if isinstance(error, NeverSucceeds) else 1)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (`prog: error: ...`), not usage plus error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def checked(name: str, parse: Callable[[str], Number], holds: Callable[[Number], bool],
            requirement: str) -> Callable[[str], Number]:
    """An argparse type: what `parse` reads from the text, refused in one line unless it `holds`.
    `name` is what argparse calls the type when `parse` itself fails ("invalid <name> value")."""
    def convert(text: str) -> Number:
        value = parse(text)
        if not holds(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    convert.__name__ = name
    return convert


positive_int = checked("positive_int", int, lambda value: value >= 1, "a positive integer")
non_negative_int = checked("non_negative_int", int, lambda value: value >= 0, "a whole number >= 0")
positive_float = checked("positive_float", float, lambda value: value > 0, "a positive number")
non_negative_float = checked("non_negative_float", float, lambda value: 0 <= value < math.inf,
                             "a finite number >= 0")
fraction = checked("fraction", float, lambda value: 0 <= value <= 1, "between 0 and 1")


def http_url(text: str) -> str:
    if not re.match(r"^https?://[^/]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def run(prog: str, main: Callable[[Sequence[str] | None], None], argv: Sequence[str] | None = None,
        expected: tuple[type[BaseException], ...] = ()) -> None:
    """Runs `main`; the errors a user can cause (UsageError and `expected`) become one line.

    At exit the interpreter's last garbage collections skip what is alive when atexit's handlers run
    (gc.freeze): scanning every object of TensorFlow's modules only to end the process was most of an
    exit's time, and held a worker or parameter server stopped by SIGTERM for seconds
    (docs/results/index.md#the-test-suite)."""
    atexit.register(gc.freeze)
    try:
        main(argv)
    except (UsageError, *expected) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, UsageError) else 1)
