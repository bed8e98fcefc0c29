"""The capacity probe keeps doubling until the pipeline refuses a real share."""

from specbatch.loadtest.capacity import OVERLOADED_SHARE, Probe, describe, probe_until_overloaded


def server_of(capacity_rps: float, seconds: float = 60.0):
    """A pipeline that answers up to ``capacity_rps`` and refuses the rest at once."""

    def probe(rate: float) -> Probe:
        sent = round(rate * seconds)
        answered = min(sent, round(capacity_rps * seconds))
        return Probe(rate, sent, answered, sent - answered, answered / seconds)

    return probe


def test_a_probe_the_server_keeps_up_with_is_doubled_until_it_overloads():
    best, probes = probe_until_overloaded(server_of(45.0), 30.0)
    assert [p.offered_rps for p in probes] == [30.0, 60.0]
    assert [p.overloaded for p in probes] == [False, True]
    assert best.answered_rps == 45.0
    assert "never overloaded" not in describe(probes)


def test_an_overloading_first_probe_is_the_only_one():
    best, probes = probe_until_overloaded(server_of(20.0), 30.0)
    assert len(probes) == 1 and best.answered_rps == 20.0


def test_doublings_are_bounded_and_the_result_is_called_a_lower_bound():
    best, probes = probe_until_overloaded(server_of(1000.0), 30.0, doublings=2)
    assert [p.offered_rps for p in probes] == [30.0, 60.0, 120.0]
    assert best.answered_rps == 120.0
    assert describe(probes).endswith("never overloaded, so a lower bound")


def test_a_few_refusals_of_a_poisson_burst_are_not_overload():
    sent = 1820
    assert not Probe(30.0, sent, sent - 9, 9, 29.66).overloaded  # the soak probe of 2026-12-05
    refused = int(OVERLOADED_SHARE * sent) + 1
    assert Probe(30.0, sent, sent - refused, refused, 29.0).overloaded
