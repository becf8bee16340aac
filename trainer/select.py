"""Rank candidate exports on the validation images and publish the best as the next version, if it
beats the served one.

    python -m trainer.select --candidates EXPORT... --data-dir DATA_DIR --model-repo REPO \\
        --model-name fmnist [--releases-dir RELEASES] [--published-version-file FILE] \\
        [--min-improvement 0.0] [--no-ensemble]

Every candidate is scored on the held-out validation images (trainer.data.split_validation: the same
images the trainer held out, which no candidate learned from) and, separately, on the test split.
With two or more candidates, one more is built: the `ensemble`, one SavedModel serving the mean
probabilities of all of them (trainer.export.save_ensemble; --no-ensemble leaves it out). The winner
is the ensemble unless a single candidate's validation accuracy beats it by more than one standard
error of the ensemble's (sqrt(p(1-p)/n): 0.049 at 0.86 on 50 images, 0.004 at 0.91 on the full
dataset's 6,000); without an ensemble, the highest validation accuracy (ties: lower validation
loss). Why the ensemble first: cross-validation on the training images put it at or above its best
member (benchmarks.variant_cv), while a few validation images cannot tell its members apart. The
test figures are reported, never used to choose, so they stay an unbiased estimate. The promotion
gate then compares the winner with the served version (model_repository.served_version: the stable
one of rollout.json, else the latest committed one in REPO, if any) on the same validation images:
the winner is published only if its validation accuracy is at least the served one's plus
--min-improvement (0, the default, means "not worse"). With no served version it is published (the
first version).

Published, it becomes REPO/<model-name>/<N>/ with `selection.json` (every candidate's scores, the
winner, the gate's comparison, the version) and `report.png` (accuracy per candidate, the winner's
confusion matrix) inside, committed last (see trainer.model_repository). With --releases-dir, also
as the release RELEASES/<model-name>/<N>/<N>/, whose parent RELEASES/<model-name>/<N> is a
cluster's storageUri. Not published, nothing under REPO's versions or RELEASES changes, one line
says why, and the run still succeeds. Either way the selection record is also written to
REPO/<model-name>/last-selection.json (a file written whole), and --published-version-file receives
the version to serve (`3\\n`): the new one, or the served one when the gate keeps it. Candidates are
exports committed by trainer.train; one without the commit marker is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from common import cli
from common.tracking_names import RUN_ID_KEY
from trainer import data, export, model_repository, report, tracking
from trainer.atomic import COMMIT_MARKER, is_committed, write_whole
from trainer.fashion_mnist import NUM_CLASSES, DatasetError, Split, load_split
from trainer.model_repository import LAST_SELECTION_FILE, SELECTION_FILE

REPORT_FILE = "report.png"
ENSEMBLE = "ensemble"  # the candidate that averages all the others
RANKING = "validation accuracy, ties: lower validation loss"
ENSEMBLE_RANKING = ("the ensemble, unless a single candidate's validation accuracy beats it by more "
                    "than one standard error of the ensemble's; else " + RANKING)
DEFAULT_MIN_IMPROVEMENT = 0.0  # "not worse": pipeline.promotion.minImprovement's default
# Accuracies on the same N images differ by multiples of 1/N (N is thousands): a tolerance this small
# only keeps float rounding (0.93 - 0.92 < 0.01) from deciding.
ACCURACY_TOLERANCE = 1e-9


class CandidateError(ValueError):
    """A candidate is not a SavedModel with the serving signatures."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    name: str
    export_dir: Path
    validation_accuracy: float  # what ranks
    validation_loss: float
    accuracy: float  # on the test split: reported only
    loss: float
    confusion: np.ndarray  # [true class, predicted class] counts on the test split
    members: tuple[str, ...] = ()  # an ensemble's candidates

    def summary(self) -> dict:
        # An ensemble's export lives in select's scratch directory until published: no path to keep.
        summary = {"name": self.name, "export_dir": None if self.members else str(self.export_dir),
                   "validation_accuracy": self.validation_accuracy,
                   "validation_loss": self.validation_loss,
                   "test_accuracy": self.accuracy, "test_loss": self.loss}
        if self.members:
            summary["members"] = list(self.members)
        return summary


def candidate_name(export_dir: Path) -> str:
    """The variant recorded by the trainer, else the directory's name."""
    try:
        return json.loads((export_dir / export.METRICS_FILE).read_text())["model"]
    except (OSError, ValueError, KeyError):
        return export_dir.name


def training_run(export_dir: Path) -> str | None:
    """The MLflow run the trainer recorded in the export's metrics.json, when it was tracked."""
    try:
        return json.loads((export_dir / export.METRICS_FILE).read_text()).get(RUN_ID_KEY)
    except (OSError, ValueError, AttributeError):
        return None


def track(selection: dict, candidates: Sequence[Path], repo: Path, releases: Path | None,
          releases_uri: str | None = None) -> None:
    """Selection's run and the published version's registration in MLflow (trainer.tracking), where
    the version is in our model repository: its release when there is one (what a cluster serves), as
    `releases_uri` names the releases directory (a cluster's storage), else as a file URI."""
    tracked = tracking.Tracking.from_environment("select")
    if not tracked.on:
        return
    runs = {candidate_name(candidate): run for candidate in candidates if (run := training_run(candidate))}
    version, name = selection["version"], selection["model_name"]
    version_dir = repo / name / str(version)
    source = None
    if version is not None and releases_uri:
        source = f"{releases_uri.rstrip('/')}/{name}/{version}"
    elif version is not None:
        local = model_repository.release_dir(releases, name, version) if releases else version_dir
        source = local.resolve().as_uri()
    artifacts = [version_dir / REPORT_FILE] if version is not None else []
    tracking.track_selection(tracked, selection, runs, source, artifacts)


def check_committed(candidates: Sequence[Path]) -> None:
    """An export that trainer.train did not finish (no marker) may be partial: never a candidate."""
    for candidate in candidates:
        if not is_committed(candidate):
            raise CandidateError(f"{candidate}: not a committed export (no {COMMIT_MARKER} file; "
                                 "did trainer.train finish writing it?)")


def predictions(export_dir: Path, *splits: Split, load: export.Loader = export.load_saved_model
                ) -> list[np.ndarray]:
    """The export's class probabilities for each split's images, the export loaded once; an
    unreadable export is a CandidateError."""
    try:
        predict = export.pixels_predictor(export_dir, load)
        return [predict(split.images) for split in splits]
    except (OSError, ValueError, KeyError) as error:
        raise CandidateError(
            f"{export_dir}: not a SavedModel with a '{export.PIXELS_SIGNATURE}' signature "
            f"({type(error).__name__})"
        ) from None


def evaluate(export_dir: Path, validation: Split, test: Split, name: str | None = None,
             members: tuple[str, ...] = (), load: export.Loader = export.load_saved_model) -> Evaluation:
    validation_probabilities, probabilities = predictions(export_dir, validation, test, load=load)
    validation_accuracy, validation_loss = export.accuracy_and_loss(validation_probabilities,
                                                                    validation.labels)
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=int)
    np.add.at(confusion, (test.labels, probabilities.argmax(axis=1)), 1)
    accuracy, loss = export.accuracy_and_loss(probabilities, test.labels)
    return Evaluation(name=name or candidate_name(export_dir), export_dir=export_dir,
                      validation_accuracy=validation_accuracy, validation_loss=validation_loss,
                      accuracy=accuracy, loss=loss, confusion=confusion, members=members)


def evaluate_ensemble(members: Sequence[Evaluation], scratch: Path, validation: Split, test: Split,
                      load: export.Loader = export.load_saved_model) -> Evaluation:
    """Saves the members' ensemble under `scratch` and scores the saved model itself."""
    export_dir = scratch / ENSEMBLE
    export.save_ensemble([member.export_dir for member in members], str(export_dir), load)
    return evaluate(export_dir, validation, test, name=ENSEMBLE,
                    members=tuple(member.name for member in members))


def best(evaluations: Sequence[Evaluation]) -> Evaluation:
    """Ranked on validation only: choosing on the test split would make its figure optimistic."""
    return max(evaluations, key=lambda e: (e.validation_accuracy, -e.validation_loss))


def ensemble_margin(ensemble_accuracy: float, examples: int) -> float:
    """By how much a single candidate must beat the ensemble on validation to be chosen instead: one
    standard error of the ensemble's accuracy on `examples` images (binomial)."""
    return math.sqrt(ensemble_accuracy * (1.0 - ensemble_accuracy) / examples)


def choose_winner(evaluations: Sequence[Evaluation], ensemble: Evaluation | None,
                  validation_examples: int) -> Evaluation:
    """The ensemble, unless the best single candidate beats it on validation by more than one
    standard error of the ensemble's accuracy; without an ensemble, the best on validation."""
    member = best(evaluations)
    if ensemble is None:
        return member
    margin = ensemble_margin(ensemble.validation_accuracy, validation_examples)
    if member.validation_accuracy - ensemble.validation_accuracy > margin + ACCURACY_TOLERANCE:
        return member
    return ensemble


def ensemble_record(ensemble: Evaluation, members: Sequence[Evaluation],
                    validation_examples: int) -> dict:
    """What averaging gave: the ensemble against its best member, on validation (and test, reported),
    and the margin by which a single candidate must beat it to be chosen instead."""
    member = best(members)
    return {
        "members": list(ensemble.members),
        "best_member": member.name,
        "validation_accuracy": ensemble.validation_accuracy,
        "best_member_validation_accuracy": member.validation_accuracy,
        "validation_gain": ensemble.validation_accuracy - member.validation_accuracy,
        "single_must_beat_by": ensemble_margin(ensemble.validation_accuracy, validation_examples),
        "test_accuracy": ensemble.accuracy,
        "best_member_test_accuracy": member.accuracy,
    }


def validation_accuracy(export_dir: Path, validation: Split) -> float:
    """Accuracy on the held-out validation images; a served version that cannot be read is an error
    (serving it is broken too, and a person should look before anything replaces it)."""
    (probabilities,) = predictions(export_dir, validation)
    return export.accuracy_and_loss(probabilities, validation.labels)[0]


def promotes(candidate_accuracy: float, served_accuracy: float | None, min_improvement: float) -> bool:
    """The gate: no served version, or better by at least `min_improvement` (0: not worse)."""
    if served_accuracy is None:
        return True
    return candidate_accuracy - served_accuracy >= min_improvement - ACCURACY_TOLERANCE


def gate_reason(promotion: dict) -> str:
    """One line: the decision, both validation accuracies and the margin."""
    served = promotion["served_version"]
    if served is None:
        return f"{promotion['candidate']} promoted: no served version yet (first version)"
    candidate = promotion["candidate_validation_accuracy"]
    comparison = (f"{promotion['candidate']} validation accuracy {candidate:.4f} vs served version "
                  f"{served} {promotion['served_validation_accuracy']:.4f}, "
                  f"min improvement {promotion['min_improvement']:g}")
    if promotion["promoted"]:
        return f"promoted: {comparison}"
    return f"not promoted, version {served} stays served: {comparison}"


def compare_with_served(winner: Evaluation, validation: Split, repo: Path, model_name: str,
                        min_improvement: float) -> dict:
    """The gate's record: the winner against the served version on the validation images."""
    served = model_repository.served_version(repo, model_name)
    served_accuracy = (validation_accuracy(repo / model_name / str(served), validation)
                       if served is not None else None)
    candidate_accuracy = winner.validation_accuracy
    promotion = {
        "candidate": winner.name,
        "candidate_validation_accuracy": candidate_accuracy,
        "served_version": served,
        "served_validation_accuracy": served_accuracy,
        "validation_examples": len(validation),
        "min_improvement": min_improvement,
        "promoted": promotes(candidate_accuracy, served_accuracy, min_improvement),
    }
    promotion["reason"] = gate_reason(promotion)
    return promotion


def select_and_publish(candidates: Sequence[Path], data_dir: Path, repo: Path,
                       model_name: str, releases: Path | None = None,
                       min_improvement: float = DEFAULT_MIN_IMPROVEMENT,
                       ensemble: bool = True) -> dict:
    """Evaluates, and publishes the winner (and its release, with `releases`) if the gate lets it;
    returns the selection. `version` is the new version, or None when the served one stays.
    `ensemble`: with two or more candidates, their ensemble is a candidate too."""
    check_committed(candidates)
    with tempfile.TemporaryDirectory(prefix="select-") as scratch:
        return _select_and_publish(candidates, data_dir, repo, model_name, releases, min_improvement,
                                   ensemble, Path(scratch))


def _select_and_publish(candidates: Sequence[Path], data_dir: Path, repo: Path, model_name: str,
                        releases: Path | None, min_improvement: float, ensemble: bool,
                        scratch: Path) -> dict:
    validation = data.split_validation(load_split(data_dir, "train"))[1]
    test = load_split(data_dir, "test")
    # Each candidate is read once, for its scores and again as an ensemble member (reading one takes
    # about as long as scoring it).
    load = functools.cache(export.load_saved_model)
    evaluations = [evaluate(candidate, validation, test, load=load) for candidate in candidates]
    combined = None
    if ensemble and len(evaluations) > 1:
        combined = evaluate_ensemble(evaluations, scratch, validation, test, load)
    winner = choose_winner(evaluations, combined, len(validation))
    selection = {
        "model_name": model_name,
        "ranking": ENSEMBLE_RANKING if combined else RANKING,
        "validation_examples": len(validation),
        "test_examples": len(test),
        "candidates": [e.summary() for e in evaluations],
        "ensemble": ensemble_record(combined, evaluations, len(validation)) if combined else None,
        "winner": winner.name,
        "promotion": compare_with_served(winner, validation, repo, model_name, min_improvement),
        "version": None,
    }
    if combined:
        selection["candidates"].append(combined.summary())

    def add_report(version_dir: Path, version: int) -> None:
        selection["version"] = version
        (version_dir / SELECTION_FILE).write_text(json.dumps(selection, indent=2) + "\n")
        report.write_report(version_dir / REPORT_FILE, [*evaluations, *([combined] if combined else [])],
                            winner, version, selection["promotion"])

    if selection["promotion"]["promoted"]:
        model_repository.publish(winner.export_dir, repo, model_name, add_report, releases)
    (repo / model_name).mkdir(parents=True, exist_ok=True)
    write_whole(repo / model_name / LAST_SELECTION_FILE, json.dumps(selection, indent=2) + "\n")
    return selection


def version_to_serve(selection: dict) -> int:
    """The published version, or the served one that the gate kept."""
    return selection["version"] or selection["promotion"]["served_version"]


def write_published_version(path: Path, version: int) -> None:
    """The version as plain text (`3\\n`), for a workflow engine to read as an output parameter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{version}\n")


def print_table(selection: dict, repo: Path, releases: Path | None = None) -> None:
    published = selection["version"] is not None
    validation = f"validation ({selection['validation_examples']})"
    test = f"test ({selection['test_examples']})"
    print(f"{'candidate':<20} {validation:>16} {'loss':>7} {test:>10} {'loss':>7}")
    for candidate in selection["candidates"]:
        mark = ""
        if candidate["name"] == selection["winner"]:
            mark = "  <- published" if published else "  <- best, not promoted"
        print(f"{candidate['name']:<20} {candidate['validation_accuracy']:>16.4f} "
              f"{candidate['validation_loss']:>7.4f} {candidate['test_accuracy']:>10.4f} "
              f"{candidate['test_loss']:>7.4f}{mark}")
    print(f"select: ranked on {selection['ranking']}; the test figures are reported only")
    if not published:
        print(f"select: {selection['promotion']['reason']}; nothing published")
        return
    print(f"select: {selection['promotion']['reason']}")
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
    parser.add_argument("--releases-uri",
                        help="the releases directory as the cluster names it (gs://BUCKET/releases, "
                             "pvc://CLAIM/releases): where a registered version's source points")
    parser.add_argument("--published-version-file", type=Path,
                        help="write the version to serve here: the published one, or the served "
                             "one when the gate keeps it")
    parser.add_argument("--ensemble", action=argparse.BooleanOptionalAction, default=True,
                        help=f"with two or more candidates, also build their '{ENSEMBLE}' (the mean "
                             "of their probabilities, one SavedModel), chosen unless a single "
                             "candidate beats it on validation by more than one standard error; "
                             "default: on")
    parser.add_argument("--min-improvement", type=float, default=DEFAULT_MIN_IMPROVEMENT,
                        help="publish only if the winner's validation accuracy is at least the "
                             "served version's plus this (0-1; 0: not worse)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.min_improvement <= 1.0:  # also refuses nan
        raise cli.UsageError(f"--min-improvement: must be a number from 0 to 1, got {args.min_improvement}")
    for candidate in args.candidates:
        if not candidate.is_dir():
            raise cli.UsageError(f"{candidate}: no such export directory")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    selection = select_and_publish(args.candidates, args.data_dir, args.model_repo,
                                   args.model_name, args.releases_dir, args.min_improvement,
                                   args.ensemble)
    if args.published_version_file is not None:
        write_published_version(args.published_version_file, version_to_serve(selection))
    print_table(selection, args.model_repo, args.releases_dir)
    track(selection, args.candidates, args.model_repo, args.releases_dir, args.releases_uri)


def run(argv: Sequence[str] | None = None) -> None:
    """`python -m trainer.select`: a user's mistake (arguments, candidates, data) is one line."""
    cli.run("select", main, argv, expected=(CandidateError, DatasetError))


if __name__ == "__main__":
    run()
