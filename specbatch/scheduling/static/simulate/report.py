"""What every scheduling experiment hands back: its output record, markdown tables, JSON, percentiles.

The static experiments beside this module use it, and so does the continuous admission
experiment (``specbatch.scheduling.simulate.experiments``), which imports it from here so
that the dependency between the two simulation packages runs one way only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ExperimentOutput:
    """What an experiment produced: markdown tables to print, the JSON and PNG files it wrote."""

    name: str
    tables: list[str]
    json_path: Path
    figures: list[Path] = field(default_factory=list)


def format_markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table of ``rows`` under ``headers``; floats to three decimals (one past 100)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: object) -> Path:
    """Write ``data`` (numpy scalars and paths included) as indented JSON, creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return path


def percentile_or_nan(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile, or NaN for an empty sample (a run that served nothing in its window)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _jsonable(value: object) -> object:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
