"""`pulumi up --stack local` runs this (Pulumi.yaml: main: stacks/)."""

import sys
from pathlib import Path

# Pulumi runs the program from stacks/; the packages it composes are at the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacks.program import main  # noqa: E402

main()
