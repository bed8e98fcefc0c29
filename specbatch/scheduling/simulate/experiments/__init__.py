"""The experiments the CLI runs by name; each writes JSON and PNGs into the output directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specbatch.scheduling.simulate.experiments import (
    continuous_admission,
    dynamic_vs_static,
    figure6,
    policy_comparison,
    theorem42,
)
from specbatch.scheduling.simulate.experiments.common import ExperimentOutput

EXPERIMENTS: dict[str, Callable[..., ExperimentOutput]] = {
    "theorem42": theorem42.run,
    "figure6": figure6.run,
    "dynamic_vs_static": dynamic_vs_static.run,
    "policy_comparison": policy_comparison.run,
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
