"""A pipeline's capacity: the answers per second it completes under sustained overload.

Load tests that run "at 80 % of capacity" need a probe that really overloads: a probe
the server keeps up with measures the offered rate, not the server, and every load
derived from it is lighter than it says. As the code got faster, the soak's fixed
30 req/s probe came to be answered all but 9 of 1,820 requests (29.66 req/s "capacity",
2026-12-05), so the soak ran at 80 % of the probe, not of the server. Here the probe
doubles its rate until the server refuses a real share of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OVERLOADED_SHARE = 0.05  # refused above this share of a probe's requests: past capacity
DOUBLINGS = 2  # at most this many probes after the first, each at twice the rate


@dataclass(frozen=True)
class Probe:
    """What one probe at ``offered_rps`` got back."""

    offered_rps: float
    sent: int
    answered: int
    refused: int
    answered_rps: float  # answers over the span from the first send to the last answer

    @property
    def overloaded(self) -> bool:
        """Refused more than a Poisson burst explains: the queue bound saw sustained excess."""
        return self.refused > OVERLOADED_SHARE * self.sent


def probe_until_overloaded(
    probe: Callable[[float], Probe], rate: float, doublings: int = DOUBLINGS
) -> tuple[Probe, list[Probe]]:
    """Probe at ``rate``, doubling it while the pipeline keeps up, at most ``doublings``
    times. Returns the probe that answered the most per second (the capacity; where none
    overloaded, a lower bound the caller should say it is) and every probe run."""
    probes = [probe(rate)]
    while not probes[-1].overloaded and len(probes) <= doublings:
        rate *= 2
        probes.append(probe(rate))
    return max(probes, key=lambda p: p.answered_rps), probes


def describe(probes: list[Probe]) -> str:
    """One line for logs and report headers: every probe, and whether any overloaded."""
    runs = ", ".join(
        f"{p.offered_rps:g} req/s offered: {p.answered} answered, {p.refused} refused" for p in probes
    )
    verdict = "" if any(p.overloaded for p in probes) else "; never overloaded, so a lower bound"
    return runs + verdict
