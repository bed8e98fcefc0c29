"""Writing a benchmark's matplotlib figure: laid out, its folder made, saved, closed.

Every benchmark and report ends its plot the same way; closing the figure matters in
long runs that draw many (pyplot keeps every open figure alive).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(figure: Any, path: Path, dpi: int = 110) -> Path:
    """Save ``figure`` (a ``matplotlib.figure.Figure``) as ``path`` and close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path
