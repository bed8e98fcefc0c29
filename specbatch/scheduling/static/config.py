"""PolicyConfig: every knob of the static batch-level policy, validated once at construction.

A configuration error must fail loudly when a policy or a simulation sweep is built, not as
a strange batch deep into a run, so every field is checked here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.scheduling.bins import BinBoundaries
from specbatch.scheduling.errors import PolicyConfigError

BOUNDARY_MODES = ("equal_mass", "fixed")
BIN_SELECTIONS = ("oldest_head", "longest_queue", "round_robin")


@dataclass(frozen=True)
class PolicyConfig:
    """Configuration of :class:`~specbatch.scheduling.static.policy.SchedulingPolicy`.

    Bins
        ``num_bins`` bins by predicted output tokens. ``boundaries`` is ``"fixed"`` (equally
        spaced over [min_len, max_len], the layout the uniform theory assumes),
        ``"equal_mass"`` (quantiles of the last ``boundary_window`` predictions, recomputed
        every ``boundary_refresh_every`` submissions once ``boundary_min_samples`` are seen;
        equally spaced until then), or an explicit ascending sequence of ``num_bins - 1``
        interior cut points.

    Batch size
        ``fixed_batch_size=B`` with ``dynamic=False`` is the paper-faithful fixed-B mode: a bin
        holding B requests forms a batch of exactly B, pushed to a central FIFO that workers pop.
        Without ``fixed_batch_size`` batches are formed when a worker asks: of size
        min(b_mem, b_SLA) clamped to [b_min, b_max] when ``dynamic``, else ``b_max``.
        ``d_sla_s=None`` switches the SLA controller off (b_SLA = b_max).

    Waiting
        ``flush_window_s``: a partly filled batch goes once its oldest request waited this long
        (None: never, the paper's setting). ``starvation_bound_s``: a bin whose head waited this
        long is served before any other (None: no guard).
    """

    num_bins: int = 4
    boundaries: str | Sequence[float] = "equal_mass"
    max_len: float = 4096.0
    min_len: float = 0.0
    boundary_window: int = 2000
    boundary_refresh_every: int = 100
    boundary_min_samples: int = 100
    bin_selection: str = "oldest_head"
    starvation_bound_s: float | None = 10.0
    flush_window_s: float | None = 0.05
    fixed_batch_size: int | None = None
    dynamic: bool = True
    b_min: int = 1
    b_max: int = 64
    eps_mem: float = 0.05
    d_sla_s: float | None = None
    eps_d: float | None = None
    alpha: int = 4
    delta: int = 2
    latency_window: int = 4
    stats_min_samples: int = 16

    def __post_init__(self) -> None:
        _require_int(self, "num_bins", minimum=1)
        _require_finite(self, "max_len")
        _require_finite(self, "min_len")
        if not 0 <= self.min_len < self.max_len:
            raise PolicyConfigError(
                f"need 0 <= min_len < max_len, got min_len={self.min_len}, max_len={self.max_len}"
            )
        if isinstance(self.boundaries, str):
            if self.boundaries not in BOUNDARY_MODES:
                raise PolicyConfigError(
                    f"boundaries must be one of {BOUNDARY_MODES} or a sequence of cut points, "
                    f"got {self.boundaries!r}"
                )
        else:
            cuts = list(self.boundaries)
            if len(cuts) != self.num_bins - 1:
                raise PolicyConfigError(
                    f"explicit boundaries need num_bins - 1 = {self.num_bins - 1} cut points, got {len(cuts)}"
                )
            finite = all(isinstance(c, (int, float)) and math.isfinite(c) for c in cuts)
            if not finite or any(b <= a for a, b in itertools.pairwise(cuts)):
                raise PolicyConfigError(
                    f"explicit boundaries must be finite and strictly ascending, got {cuts}"
                )
            object.__setattr__(self, "boundaries", tuple(float(c) for c in cuts))
        _require_int(self, "boundary_window", minimum=1)
        _require_int(self, "boundary_refresh_every", minimum=1)
        _require_int(self, "boundary_min_samples", minimum=1)
        if self.boundary_min_samples > self.boundary_window:
            raise PolicyConfigError(
                f"boundary_min_samples ({self.boundary_min_samples}) cannot exceed boundary_window "
                f"({self.boundary_window}): the window would never hold enough predictions"
            )
        if self.bin_selection not in BIN_SELECTIONS:
            raise PolicyConfigError(
                f"bin_selection must be one of {BIN_SELECTIONS}, got {self.bin_selection!r}"
            )
        for name in ("starvation_bound_s", "flush_window_s"):
            if getattr(self, name) is not None:
                _require_finite(self, name, minimum=0.0)
        _require_int(self, "b_min", minimum=1)
        _require_int(self, "b_max", minimum=1)
        if self.b_min > self.b_max:
            raise PolicyConfigError(f"b_min ({self.b_min}) must not exceed b_max ({self.b_max})")
        if self.fixed_batch_size is not None:
            _require_int(self, "fixed_batch_size", minimum=1)
            if self.dynamic:
                raise PolicyConfigError(
                    "fixed_batch_size is a static batch size: set dynamic=False with it "
                    "(dynamic mode sizes each batch from b_mem and b_SLA, capped by b_max)"
                )
        if not isinstance(self.dynamic, bool):
            raise PolicyConfigError(f"dynamic must be a bool, got {self.dynamic!r}")
        _require_finite(self, "eps_mem")
        if not 0 < self.eps_mem < 0.5:
            raise PolicyConfigError(
                f"eps_mem is a tail probability and must lie in (0, 0.5), got {self.eps_mem}"
            )
        if self.d_sla_s is not None:
            _require_finite(self, "d_sla_s")
            if self.d_sla_s <= 0:
                raise PolicyConfigError(f"d_sla_s must be > 0 seconds per token, got {self.d_sla_s}")
        if self.eps_d is not None:
            _require_finite(self, "eps_d", minimum=0.0)
        _require_int(self, "alpha", minimum=1)
        _require_int(self, "delta", minimum=0)
        _require_int(self, "latency_window", minimum=1)
        _require_int(self, "stats_min_samples", minimum=1)

    def bin_boundaries(self) -> BinBoundaries:
        """The bin edges this configuration describes, fresh (no predictions observed yet)."""
        return BinBoundaries(
            self.num_bins,
            self.boundaries,
            low=self.min_len,
            high=self.max_len,
            window=self.boundary_window,
            refresh_every=self.boundary_refresh_every,
            min_samples=self.boundary_min_samples,
        )

    @property
    def sla_tolerance_s(self) -> float:
        """ε_D in seconds per token: the configured value, else 10 % of D_SLA."""
        if self.d_sla_s is None:
            return 0.0
        return self.eps_d if self.eps_d is not None else 0.1 * self.d_sla_s


def _require_int(cfg: PolicyConfig, name: str, *, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PolicyConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


def _require_finite(cfg: PolicyConfig, name: str, *, minimum: float | None = None) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyConfigError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise PolicyConfigError(f"{name} must be >= {minimum}, got {value!r}")
