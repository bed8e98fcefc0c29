"""The experiments that evaluate the static policy, by the name the command line knows them.

``python -m specbatch.scheduling.simulate`` runs them, together with the continuous admission
experiment of ``specbatch.scheduling.simulate.experiments``.
"""

from __future__ import annotations

from collections.abc import Callable

from specbatch.scheduling.static.simulate.experiments import (
    dynamic_vs_static,
    figure6,
    policy_comparison,
    theorem42,
)
from specbatch.scheduling.static.simulate.report import ExperimentOutput

STATIC_EXPERIMENTS: dict[str, Callable[..., ExperimentOutput]] = {
    "theorem42": theorem42.run,
    "figure6": figure6.run,
    "dynamic_vs_static": dynamic_vs_static.run,
    "policy_comparison": policy_comparison.run,
}
