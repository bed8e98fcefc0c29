"""Prefix reuse through the real server: a second request with the same long prompt is
placed where the first ran, starts on the blocks the first computed (the instance's hit
counter moves by every whole block but the one holding its last token), and gets the
same greedy answer."""

from __future__ import annotations

import time

import pytest
from helpers import metric_values, scrape
from specbatch_client import GenerationOptions, SpecbatchClient

pytestmark = pytest.mark.integration

BLOCK = 16  # the cpu config's kv_block_size
PROMPT = (
    "Instruction: You answer for the help desk of a city library. Be brief and friendly, name "
    "the floor and the desk a visitor should go to, and never invent opening hours: the main "
    "building opens at nine on weekdays and at ten on Saturdays, the children's floor is the "
    "second, the archive is in the basement and needs a reader's card, and printing costs ten "
    "cents a page at the desk by the entrance.\nQuestion: Where can I print a document?\nGeneration:"
)


def instance_total(server, name: str, instance: str) -> float | None:
    """The instance's counter ``name``, or None while the instance has not reported one."""
    values = metric_values(scrape(server.metrics_url), name)
    mine = [value for labels, value in values.items() if f'instance="{instance}"' in labels]
    return sum(mine) if mine else None


def until(predicate, what: str, timeout_s: float = 10.0) -> None:
    """Poll the server's metrics (published at most twice a second) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_second_identical_prefix_request_hits_the_cache_with_the_same_answer(server):
    client = SpecbatchClient(server.http_url)
    options = GenerationOptions(max_tokens=12, temperature=0.0)
    first = client.generate([PROMPT], options)[0]
    assert first.error == "" and first.model_instance
    instance = first.model_instance
    hits = "specbatch_prefix_hit_tokens_total"
    until(lambda: instance_total(server, hits, instance) is not None, f"{instance}'s hit counter")
    before = instance_total(server, hits, instance)

    second = client.generate([PROMPT], options)[0]

    assert second.model_instance == instance  # placed where its prefix lives
    assert second.text == first.text
    assert second.num_input_tokens == first.num_input_tokens
    expected = (second.num_input_tokens - 1) // BLOCK * BLOCK
    until(
        lambda: instance_total(server, hits, instance) - before >= expected,
        f"{expected} hit tokens on {instance}",
    )
