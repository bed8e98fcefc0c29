"""Latency over time from Locust's full stats history, as one PNG.

Locust's `<prefix>_stats_history.csv` (written with `--csv-full-history`) holds, once a
second, each request type and name with percentiles over the last ~10 seconds. The
figure has one panel per latency type (TTFT, TPOT, end-to-end per protocol) with p50
and p95 lines per task and the SLA target as a dotted line, and a last panel with the
achieved request rate and the user count, so a breach can be placed in time: warm-up,
a burst, or a slow drift.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

from specbatch.figures import save_figure
from specbatch.loadtest.profiles import LoadProfile
from specbatch.loadtest.sla import E2E_TYPES, GRPC_E2E, HTTP_E2E, TPOT, TTFT, StatsFileError

PANELS = (TTFT, TPOT, GRPC_E2E, HTTP_E2E)
_TARGET_FIELD = {TTFT: "ttft_p95_ms", TPOT: "tpot_p95_ms", GRPC_E2E: "e2e_p99_ms", HTTP_E2E: "e2e_p99_ms"}
_TARGET_LABEL = {TTFT: "p95 target", TPOT: "p95 target", GRPC_E2E: "p99 target", HTTP_E2E: "p99 target"}


def _float(value: str) -> float | None:
    """A percentile cell; Locust writes 0 while its 10-second window is still empty, so 0 is no data."""
    return None if value in ("", "N/A") or float(value) == 0 else float(value)


def read_history(
    path: Path,
) -> tuple[
    dict[tuple[str, str], list[tuple[float, float | None, float | None]]], list[tuple[float, float, int]]
]:
    """Per (type, task): (t, p50, p95) samples; and per second: (t, E2E requests/s, users)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise StatsFileError(f"cannot read Locust stats history {path}: {exc.strerror or exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    needed = {"Timestamp", "User Count", "Type", "Name", "Requests/s", "50%", "95%"}
    missing = needed - set(reader.fieldnames or ())
    if missing:
        raise StatsFileError(
            f"{path} is not a Locust stats history: no column(s) {', '.join(sorted(missing))}"
        )
    series: dict[tuple[str, str], list[tuple[float, float | None, float | None]]] = defaultdict(list)
    rates: dict[float, float] = defaultdict(float)
    users: dict[float, int] = {}
    records = list(reader)
    if not records:
        return {}, []
    origin = min(float(record["Timestamp"]) for record in records)
    for record in records:
        t = float(record["Timestamp"]) - origin
        users[t] = int(record["User Count"])
        if record["Type"] in PANELS:
            series[(record["Type"], record["Name"])].append((t, _float(record["50%"]), _float(record["95%"])))
        if record["Type"] in E2E_TYPES:
            rates[t] += float(record["Requests/s"])
    load = [(t, rates.get(t, 0.0), users[t]) for t in sorted(users)]
    return dict(series), load


def plot_latency_over_time(history_csv: Path, out_png: Path, profile: LoadProfile | None = None) -> Path:
    """Write the latency-over-time PNG; targets are drawn when the profile is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, load = read_history(history_csv)
    panels = [kind for kind in PANELS if any(key[0] == kind for key in series)]
    figure, axes = plt.subplots(len(panels) + 1, 1, figsize=(10, 2.6 * (len(panels) + 1)), sharex=True)
    axes = list(axes) if len(panels) else [axes]
    colours = {}
    for axis, kind in zip(axes, panels, strict=False):
        for (series_kind, task), samples in sorted(series.items()):
            if series_kind != kind:
                continue
            colour = colours.setdefault(task, f"C{len(colours)}")
            times = [t for t, _, _ in samples]
            axis.plot(times, [p95 for _, _, p95 in samples], color=colour, label=f"{task} p95")
            axis.plot(
                times,
                [p50 for _, p50, _ in samples],
                color=colour,
                linestyle="--",
                alpha=0.6,
                label=f"{task} p50",
            )
            targets = profile.sla.tasks.get(task) if profile else None
            target = getattr(targets, _TARGET_FIELD[kind]) if targets else None
            if target is not None:
                axis.axhline(
                    target, color=colour, linestyle=":", linewidth=1, label=f"{task} {_TARGET_LABEL[kind]}"
                )
        axis.set_ylabel(f"{kind} (ms)")
        axis.set_yscale("log")
        axis.legend(fontsize="x-small", ncol=3, loc="upper left")
        axis.grid(alpha=0.3)
    rate_axis = axes[-1]
    rate_axis.plot([t for t, _, _ in load], [r for _, r, _ in load], color="black", label="requests/s")
    rate_axis.set_ylabel("requests/s")
    user_axis = rate_axis.twinx()
    user_axis.step([t for t, _, _ in load], [u for _, _, u in load], color="grey", where="post", alpha=0.6)
    user_axis.set_ylabel("users")
    rate_axis.set_xlabel("seconds since start")
    rate_axis.grid(alpha=0.3)
    title = f"Latency over time — profile {profile.name}" if profile else "Latency over time"
    axes[0].set_title(title)
    return save_figure(figure, out_png, dpi=100)
