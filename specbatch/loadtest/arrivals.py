"""Arrival schedules that turn a Locust user's wait_time into an offered-load shape.

Each user owns a schedule of arrival instants on a clock shared by all users (seconds
since the test started). After a request the user sleeps until its next arrival, or
not at all when it is already late, so the offered load holds while the server keeps
up and degrades to back-to-back requests (a closed loop) when it does not. N users at
rate r/N each add up to the profile's aggregate rate r: independent Poisson streams
sum to a Poisson stream; constant-rate users start at random phases so they do not
arrive in lockstep; burst users share the clock, so their ON phases line up.
"""

from __future__ import annotations

import random

from specbatch.loadtest.profiles import Arrival


class ArrivalSchedule:
    """Arrival instants for one user; `wait(now)` is how long to sleep before the next request."""

    def __init__(self, arrival: Arrival, users: int, rng: random.Random) -> None:
        if users < 1:
            raise ValueError(f"users must be >= 1, got {users}")
        self.arrival = arrival
        self.users = users
        self.rng = rng
        self.next_at = self._first_arrival()

    def _first_arrival(self) -> float:
        if self.arrival.shape == "constant":
            return self.rng.uniform(0.0, self.users / self.arrival.rate)
        return self._after(0.0)

    def _after(self, t: float) -> float:
        """The arrival that follows one at time t."""
        if self.arrival.shape == "constant":
            return t + self.users / self.arrival.rate
        if self.arrival.shape == "poisson":
            return t + self.rng.expovariate(self.arrival.rate / self.users)
        return self._next_burst_arrival(t)

    def _next_burst_arrival(self, t: float) -> float:
        """Next event of a Poisson process whose rate switches between ON and OFF phases.

        Draw one unit-rate exponential and spend it through the phases, each phase
        consuming rate × length of it: the inverse of the integrated rate.
        """
        budget = self.rng.expovariate(1.0)
        period = self.arrival.on_s + self.arrival.off_s
        while True:
            into = t % period
            if into < self.arrival.on_s:
                rate, remaining = self.arrival.on_rate, self.arrival.on_s - into
            else:
                rate, remaining = self.arrival.off_rate, period - into
            rate /= self.users
            if rate * remaining >= budget:
                return t + budget / rate
            budget -= rate * remaining
            t += remaining

    def wait(self, now: float) -> float:
        """Seconds to sleep from `now` (test clock) until this user's next request; 0 when late."""
        delay = max(0.0, self.next_at - now)
        self.next_at = self._after(self.next_at)
        return delay
