"""The tests' pinned files: every one verified, downloading what is missing.

    python -m testdata            # `make fixtures`

One line per file saying where it was found; exit status 1 with one line per problem otherwise.
"""

from __future__ import annotations

import sys

from testdata.fixtures import FixtureError, resolve, sample_dir
from testdata.pins import CRD_PINS


def main() -> int:
    problems = 0
    for pin in CRD_PINS.values():
        try:
            path = resolve(pin, download_missing=True)
        except FixtureError as error:
            print(f"error: {error}", file=sys.stderr)
            problems += 1
        else:
            print(f"ok  {pin.name}  {path}")
    try:
        print(f"ok  the Fashion-MNIST sample  {sample_dir()}")
    except FixtureError as error:
        print(f"error: {error}", file=sys.stderr)
        problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
