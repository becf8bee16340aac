"""Evaluate candidate exports on the test split and publish the best as the next version.

    python -m trainer.select --candidates EXPORT... --data-dir DATA_DIR --model-repo REPO \\
        --model-name fmnist [--releases-dir RELEASES] [--published-version-file FILE]

The winner has the highest test accuracy (ties: lower loss). It is published as
REPO/<model-name>/<N>/ with `selection.json` (every candidate's scores, the winner, the version)
and `report.png` (accuracy per candidate, the winner's confusion matrix) inside, committed last
(see trainer.model_repository). With --releases-dir, also as the release RELEASES/<model-name>/<N>/<N>/,
whose parent RELEASES/<model-name>/<N> is a cluster's storageUri. With --published-version-file, N
is written there (`3\\n`) once everything is published. Candidates are exports committed by
trainer.train; one without the commit marker is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from common import cli
from trainer import export, model_repository, report
from trainer.atomic import COMMIT_MARKER, is_committed
from trainer.fashion_mnist import NUM_CLASSES, DatasetError, Split, load_split

SELECTION_FILE = "selection.json"
REPORT_FILE = "report.png"


class CandidateError(ValueError):
    """A candidate is not a SavedModel with the serving signatures."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    name: str
    export_dir: Path
    accuracy: float
    loss: float
    confusion: np.ndarray  # [true class, predicted class] counts

    def summary(self) -> dict:
        return {"name": self.name, "export_dir": str(self.export_dir),
                "test_accuracy": self.accuracy, "test_loss": self.loss}


def candidate_name(export_dir: Path) -> str:
    """The variant recorded by the trainer, else the directory's name."""
    try:
        return json.loads((export_dir / export.METRICS_FILE).read_text())["model"]
    except (OSError, ValueError, KeyError):
        return export_dir.name


def check_committed(candidates: Sequence[Path]) -> None:
    """An export that trainer.train did not finish (no marker) may be partial: never a candidate."""
    for candidate in candidates:
        if not is_committed(candidate):
            raise CandidateError(f"{candidate}: not a committed export (no {COMMIT_MARKER} file; "
                                 "did trainer.train finish writing it?)")


def evaluate(export_dir: Path, test: Split) -> Evaluation:
    try:
        probabilities = export.predict_pixels(export_dir, test.images)
    except (OSError, ValueError, KeyError) as error:
        raise CandidateError(
            f"{export_dir}: not a SavedModel with a '{export.PIXELS_SIGNATURE}' signature "
            f"({type(error).__name__})"
        ) from None
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=int)
    np.add.at(confusion, (test.labels, probabilities.argmax(axis=1)), 1)
    accuracy, loss = export.accuracy_and_loss(probabilities, test.labels)
    return Evaluation(name=candidate_name(export_dir), export_dir=export_dir, accuracy=accuracy,
                      loss=loss, confusion=confusion)


def best(evaluations: Sequence[Evaluation]) -> Evaluation:
    return max(evaluations, key=lambda e: (e.accuracy, -e.loss))


def select_and_publish(candidates: Sequence[Path], data_dir: Path, repo: Path,
                       model_name: str, releases: Path | None = None) -> dict:
    """Evaluates, publishes the winner (and its release, with `releases`); returns the selection."""
    check_committed(candidates)
    test = load_split(data_dir, "test")
    evaluations = [evaluate(candidate, test) for candidate in candidates]
    winner = best(evaluations)
    selection = {
        "model_name": model_name,
        "test_examples": len(test),
        "candidates": [e.summary() for e in evaluations],
        "winner": winner.name,
    }

    def add_report(version_dir: Path, version: int) -> None:
        selection["version"] = version
        (version_dir / SELECTION_FILE).write_text(json.dumps(selection, indent=2) + "\n")
        report.write_report(version_dir / REPORT_FILE, evaluations, winner, version)

    model_repository.publish(winner.export_dir, repo, model_name, add_report, releases)
    return selection


def write_published_version(path: Path, version: int) -> None:
    """The version as plain text (`3\\n`), for a workflow engine to read as an output parameter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{version}\n")


def print_table(selection: dict, repo: Path, releases: Path | None = None) -> None:
    print(f"{'candidate':<20} {'test accuracy':>13} {'test loss':>10}")
    for candidate in selection["candidates"]:
        mark = "  <- published" if candidate["name"] == selection["winner"] else ""
        print(f"{candidate['name']:<20} {candidate['test_accuracy']:>13.4f} "
              f"{candidate['test_loss']:>10.4f}{mark}")
    version_dir = repo / selection["model_name"] / str(selection["version"])
    if releases is not None:
        release = model_repository.release_dir(releases, selection["model_name"], selection["version"])
        print(f"select: release (a storageUri holding only version {selection['version']}): {release}")
    print(f"select: published {selection['winner']} as version {selection['version']}: {version_dir}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="select", description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=Path, nargs="+", required=True,
                        help="export directories written by trainer.train")
    parser.add_argument("--data-dir", type=Path, required=True, help="written by trainer.ingest")
    parser.add_argument("--model-repo", type=Path, required=True)
    parser.add_argument("--model-name", default="fmnist")
    parser.add_argument("--releases-dir", type=Path,
                        help="also publish the version as RELEASES/<model-name>/<N>/<N>/")
    parser.add_argument("--published-version-file", type=Path,
                        help="write the published version number here once published")
    args = parser.parse_args(argv)
    for candidate in args.candidates:
        if not candidate.is_dir():
            raise cli.UsageError(f"{candidate}: no such export directory")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    selection = select_and_publish(args.candidates, args.data_dir, args.model_repo,
                                   args.model_name, args.releases_dir)
    if args.published_version_file is not None:
        write_published_version(args.published_version_file, selection["version"])
    print_table(selection, args.model_repo, args.releases_dir)


if __name__ == "__main__":
    cli.run("select", main, expected=(CandidateError, DatasetError))
