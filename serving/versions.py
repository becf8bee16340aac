"""Which versions the server serves, and which one answers a batch: the stable version, and during a
canary a second version that answers `canary_percent`% of the batches (chosen at random per batch,
so the split holds whatever the load and the batch sizes).

What to serve comes from the model's base path: its rollout state (trainer.model_repository's
ROLLOUT_FILE) if there is one, else the newest committed version alone, as before canaries existed.
TensorFlow-free: a loaded version is whatever the loader returns.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Callable, Generic, TypeVar

from trainer import model_repository
from trainer.model_repository import RolloutState

PERCENT = 100
Loaded = TypeVar("Loaded")


def wanted_state(base: Path) -> RolloutState | None:
    """What should be served from `base`: its rollout state, else its newest committed version alone;
    None when nothing is published. A rollout state naming an uncommitted version is an error (a
    ValueError naming it): the versions served now go on serving."""
    state = model_repository.read_rollout(base)
    if state is None:
        latest = model_repository.latest_committed(base)
        return RolloutState(latest) if latest is not None else None
    committed = set(model_repository.committed_versions(base))
    for number in (state.stable, state.canary):
        if number is not None and number not in committed:
            raise ValueError(f"{base / model_repository.ROLLOUT_FILE} names version {number}, "
                             f"which is not a committed version under {base}")
    return state


@dataclasses.dataclass(frozen=True)
class VersionSet(Generic[Loaded]):
    """The loaded versions of one rollout state; `choose` picks the one that answers a batch."""
    state: RolloutState
    loaded: dict[int, Loaded]
    draw: Callable[[], float] = random.random  # uniform in [0, 1)

    @property
    def stable(self) -> Loaded:
        return self.loaded[self.state.stable]

    def choose(self) -> Loaded:
        state = self.state
        if state.canary is not None and self.draw() * PERCENT < state.canary_percent:
            return self.loaded[state.canary]
        return self.stable


def load_state(state: RolloutState, current: VersionSet[Loaded] | None,
               load: Callable[[int], Loaded], draw: Callable[[], float] = random.random
               ) -> VersionSet[Loaded]:
    """The versions of `state`, reusing those `current` has loaded and loading the others."""
    already = current.loaded if current is not None else {}
    numbers = [state.stable] + ([state.canary] if state.canary is not None else [])
    return VersionSet(state, {number: already[number] if number in already else load(number)
                              for number in numbers}, draw)
