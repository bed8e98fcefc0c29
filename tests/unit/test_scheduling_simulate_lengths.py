"""Length predictions in the step simulator made as the server makes them: at each
arrival, from the rows served before it."""

from __future__ import annotations

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.requests import QueuedRequest
from specbatch.scheduling.simulate.continuous import ContinuousSimulator, SimInstance, SimRequest, StepCosts


class MeanOfServed:
    """Predicts the mean length of the rows served so far (8 before any), and logs the
    order of its calls."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.calls: list[tuple[str, int, float]] = []

    def predicted(self, request: SimRequest) -> float:
        guess = sum(self.lengths) / len(self.lengths) if self.lengths else 8.0
        self.calls.append(("predicted", request.request_id, guess))
        return guess

    def served(self, request: SimRequest) -> None:
        self.lengths.append(request.output_tokens)
        self.calls.append(("served", request.request_id, float(request.output_tokens)))


CONFIG = AdmissionConfig(order="fcfs", max_rows=4, queue_limit=16, sla_aware=False, memory_aware=False)
COSTS = StepCosts(base_s=0.01, per_row_s=0.0)


class Queued(AdmissionPolicy):
    """The server's policy, keeping the predictions of the prompts it queued in ``seen``."""

    def __init__(self, seen: list[float]) -> None:
        super().__init__(CONFIG)
        self.seen = seen

    def enqueue_all(self, requests: list[QueuedRequest]) -> None:
        self.seen.extend(request.predicted_tokens for request in requests)
        super().enqueue_all(requests)


def test_each_arrival_is_predicted_from_the_rows_served_before_it() -> None:
    models: list[MeanOfServed] = []
    seen: list[float] = []

    def fresh() -> MeanOfServed:
        models.append(MeanOfServed())
        return models[-1]

    simulator = ContinuousSimulator(lambda: Queued(seen), [SimInstance()], COSTS, lengths=fresh)
    # 20 and 40 tokens end at 0.2 s and 1.4 s: the second arrives after the first ended,
    # the third after both
    requests = [
        SimRequest(0, 0.0, 4, 20, 99.0),
        SimRequest(1, 1.0, 4, 40, 99.0),
        SimRequest(2, 2.0, 4, 5, 99.0),
    ]
    outcomes = simulator.run(requests)
    assert [o.status for o in outcomes] == ["served"] * 3
    assert seen == [8.0, 20.0, 30.0], "the policy queues what the model predicted, not the 99 given"
    assert [call[:2] for call in models[0].calls] == [
        ("predicted", 0), ("served", 0), ("predicted", 1), ("served", 1), ("predicted", 2), ("served", 2)
    ]
    simulator.run(requests)
    assert len(models) == 2 and models[1].calls[0] == ("predicted", 0, 8.0), "a fresh model each run"


def test_without_a_length_model_each_request_keeps_its_prediction() -> None:
    seen: list[float] = []
    simulator = ContinuousSimulator(lambda: Queued(seen), [SimInstance()], COSTS)
    simulator.run([SimRequest(0, 0.0, 4, 20, 99.0), SimRequest(1, 1.0, 4, 40, 77.0)])
    assert seen == [99.0, 77.0]
