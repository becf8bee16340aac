"""The selection report: test accuracy per candidate, the winner's confusion matrix and the promotion
gate's comparison with the served version, as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and in pods
import matplotlib.pyplot as plt  # noqa: E402

from trainer.fashion_mnist import CLASS_NAMES  # noqa: E402

if TYPE_CHECKING:
    from trainer.select import Evaluation

WINNER_COLOUR, OTHER_COLOUR = "tab:green", "tab:grey"


def write_report(path: Path, evaluations: Sequence[Evaluation], winner: Evaluation,
                 version: int, promotion: dict | None = None) -> None:
    """`promotion`: trainer.select's gate record, shown as the figure's title (its one-line reason)."""
    figure, (bars, matrix) = plt.subplots(1, 2, figsize=(13, 5.5),
                                          gridspec_kw={"width_ratios": [1, 1.5]})
    names = [e.name for e in evaluations]
    accuracies = [e.accuracy for e in evaluations]
    colours = [WINNER_COLOUR if e is winner else OTHER_COLOUR for e in evaluations]
    bars.bar(names, accuracies, color=colours)
    for x, accuracy in enumerate(accuracies):
        bars.text(x, accuracy, f"{accuracy:.3f}", ha="center", va="bottom")
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("test accuracy")
    bars.set_title("Candidates (published in green)")
    bars.tick_params(axis="x", rotation=20)

    image = matrix.imshow(winner.confusion, cmap="Blues")
    for true in range(len(CLASS_NAMES)):
        for predicted in range(len(CLASS_NAMES)):
            count = winner.confusion[true, predicted]
            if count:
                dark = count > winner.confusion.max() / 2
                matrix.text(predicted, true, str(count), ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
    matrix.set_xticks(range(len(CLASS_NAMES)), CLASS_NAMES, rotation=45, ha="right")
    matrix.set_yticks(range(len(CLASS_NAMES)), CLASS_NAMES)
    matrix.set_xlabel("predicted")
    matrix.set_ylabel("true")
    matrix.set_title(f"{winner.name}, version {version}: confusion on the test split")
    figure.colorbar(image, ax=matrix)
    if promotion is not None:
        figure.suptitle(f"Promotion gate: {promotion['reason']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
