"""Command-line plumbing shared by every package's entry points: every failure is one clear line."""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Callable, NoReturn, Sequence


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (`prog: error: ...`), not usage plus error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def http_url(text: str) -> str:
    if not re.match(r"^https?://[^/]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def run(prog: str, main: Callable[[Sequence[str] | None], None], argv: Sequence[str] | None = None,
        expected: tuple[type[BaseException], ...] = ()) -> None:
    """Runs `main`; the errors a user can cause (UsageError and `expected`) become one line."""
    try:
        main(argv)
    except (UsageError, *expected) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, UsageError) else 1)
