"""Every experiment the command line runs by name; each writes JSON and PNGs into the output directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specbatch.scheduling.simulate.experiments import continuous_admission
from specbatch.scheduling.static.simulate.experiments import STATIC_EXPERIMENTS
from specbatch.scheduling.static.simulate.report import ExperimentOutput

EXPERIMENTS: dict[str, Callable[..., ExperimentOutput]] = {
    **STATIC_EXPERIMENTS,
    "continuous_admission": continuous_admission.run,
}


def run_experiment(name: str, out_dir: Path, *, quick: bool = False, seed: int = 0) -> list[ExperimentOutput]:
    """Run one experiment by name, or every one for ``"all"``."""
    if name == "all":
        return [run(out_dir, quick=quick, seed=seed) for run in EXPERIMENTS.values()]
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {[*EXPERIMENTS, 'all']}")
    return [EXPERIMENTS[name](out_dir, quick=quick, seed=seed)]


__all__ = ["EXPERIMENTS", "ExperimentOutput", "run_experiment"]
