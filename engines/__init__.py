"""The training engines: `pipeline.engine` names one of them (engines/base.py says what each declares).

Adding an engine is one module beside these and one entry in ENGINES: the stacks' platform and queue,
the Argo renderer's train steps, the workflow's role and the train step all ask the engine they are
given, and never test its name (docs/extending/engine.md; tests/test_engines.py plugs in a toy one).
"""

from __future__ import annotations

from engines.base import TrainingEngine
from engines.tfjob import TFJobEngine
from engines.trainjob import TrainJobEngine

ENGINES: dict[str, TrainingEngine] = {engine.name: engine for engine in (TrainJobEngine(), TFJobEngine())}
DEFAULT_ENGINE = TrainJobEngine.name


def engine_of_job(kind: str) -> TrainingEngine:
    """The engine whose train steps create jobs of `kind`; KeyError when none does."""
    for engine in ENGINES.values():
        if engine.job_resource.kind == kind:
            return engine
    raise KeyError(kind)
