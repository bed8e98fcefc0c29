"""Output-length prediction: ordering on clear cues, and the online correction moving the right way."""

from __future__ import annotations

import threading

import pytest

from specbatch.routing import LengthPredictor

ONE_SENTENCE = "Describe the water cycle in one sentence."
TEN_TIPS = "Give me 10 tips for saving money on groceries."
ESSAY = "Write an essay about the causes of the First World War."
PLAIN = "What do you think about remote work?"


def test_cue_ordering_on_clear_cases():
    predictor = LengthPredictor()
    one_word = predictor.predict("Give a one-word answer: what is the chemical symbol for gold?", "infobench")
    sentence = predictor.predict(ONE_SENTENCE, "infobench")
    tips = predictor.predict(TEN_TIPS, "infobench")
    essay = predictor.predict(ESSAY, "infobench")
    assert one_word < sentence < tips < essay


def test_word_and_item_counts_scale_the_prediction():
    predictor = LengthPredictor()
    assert predictor.predict("Describe Paris in 50 words.", "infobench") < predictor.predict(
        "Describe Paris in 300 words.", "infobench"
    )
    assert predictor.predict("List 3 ideas for a party.", "infobench") < predictor.predict(
        "List 12 ideas for a party.", "infobench"
    )


def test_translation_scales_with_its_input():
    predictor = LengthPredictor()
    short = predictor.predict("Translate the following into German.\n\nGood morning.", "infobench")
    long_input = "The weather is lovely today. " * 20
    long = predictor.predict(f"Translate the following into German.\n\n{long_input}", "infobench")
    assert short * 10 < long


def test_task_priors_order_mmlu_graph_infobench():
    predictor = LengthPredictor()
    mmlu = predictor.predict("Question: x?\nChoices:\nA. a\nB. b", "mmlu")
    graph = predictor.predict("Find the top 1 shortest path from node 0 to node 3.", "graph")
    infobench = predictor.predict(PLAIN, "infobench")
    assert mmlu < graph < infobench


def test_more_paths_predict_a_longer_graph_answer():
    predictor = LengthPredictor()
    one = predictor.predict("Find the top 1 shortest path from node 0 to node 3.", "graph")
    five = predictor.predict("Find the top 5 shortest paths from node 0 to node 3.", "graph")
    assert one < five


def test_online_correction_moves_towards_observed_lengths():
    predictor = LengthPredictor()
    before = predictor.predict(PLAIN, "infobench")
    for _ in range(200):
        predictor.observe(PLAIN, "infobench", 3 * before)
    raised = predictor.predict(PLAIN, "infobench")
    assert before < raised <= 3 * before
    assert raised == pytest.approx(3 * before, rel=0.1)
    for _ in range(600):
        predictor.observe(PLAIN, "infobench", before // 4)
    assert predictor.predict(PLAIN, "infobench") < before


def test_a_few_observations_move_the_prediction_only_partly():
    predictor = LengthPredictor(shrinkage=8)
    before = predictor.predict(PLAIN, "infobench")
    predictor.observe(PLAIN, "infobench", 10 * before)
    after = predictor.predict(PLAIN, "infobench")
    assert before < after < 10 * before


def test_correction_is_per_task_and_cue_class():
    predictor = LengthPredictor()
    essay_before = predictor.predict(ESSAY, "infobench")
    sentence_before = predictor.predict(ONE_SENTENCE, "infobench")
    mmlu_before = predictor.predict("Question: x?\nChoices:\nA. a\nB. b", "mmlu")
    for _ in range(100):
        predictor.observe(ESSAY, "infobench", 2000)
    assert predictor.predict(ESSAY, "infobench") > essay_before
    assert predictor.predict(ONE_SENTENCE, "infobench") == sentence_before
    assert predictor.predict("Question: x?\nChoices:\nA. a\nB. b", "mmlu") == mmlu_before


def test_a_row_cut_short_raises_a_prediction_below_it_and_lowers_none():
    predictor = LengthPredictor()
    before = predictor.predict(PLAIN, "infobench")
    for _ in range(50):
        predictor.observe(PLAIN, "infobench", before // 4, cut=True)
    assert predictor.predict(PLAIN, "infobench") == before, "at least a quarter of it: nothing against it"
    for _ in range(50):
        predictor.observe(PLAIN, "infobench", 2 * before, cut=True)
    assert predictor.predict(PLAIN, "infobench") == pytest.approx(2 * before, rel=0.15)


def test_answers_cut_at_a_cap_keep_the_early_ends_from_setting_the_prediction():
    """Three rows in four run to their cap of 400 tokens, one ends by itself at 40: learned
    from the early ends alone, every prompt would be predicted at 40."""
    predictor = LengthPredictor()
    for _ in range(100):
        predictor.observe(PLAIN, "infobench", 40)
        for _ in range(3):
            predictor.observe(PLAIN, "infobench", 400, cut=True)
    assert predictor.predict(PLAIN, "infobench") >= 300


def test_cut_rows_skipped_learns_from_rows_that_ended_by_themselves_only():
    predictor = LengthPredictor(cut_rows="skipped")
    before = predictor.predict(PLAIN, "infobench")
    for _ in range(50):
        predictor.observe(PLAIN, "infobench", 2 * before, cut=True)
    assert predictor.predict(PLAIN, "infobench") == before
    with pytest.raises(ValueError, match="cut_rows"):
        LengthPredictor(cut_rows="ignored")


def test_observed_quantiles_follow_recent_traffic():
    predictor = LengthPredictor(window=100)
    assert predictor.observed_quantiles("infobench", [0.5]) is None
    for length in range(1, 101):
        predictor.observe(PLAIN, "infobench", length)
    assert predictor.observed_quantiles("infobench", [0.0, 0.5, 1.0]) == [1.0, 50.0, 100.0]
    for length in range(1001, 1101):
        predictor.observe(PLAIN, "infobench", length)
    assert predictor.observed_quantiles("infobench", [0.0, 1.0]) == [1001.0, 1100.0]


def test_concurrent_observers_and_predictors():
    predictor = LengthPredictor(window=64)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(500):
                predictor.observe(PLAIN, "infobench", 100 + (seed * 7 + i) % 50)
                predictor.predict(PLAIN, "infobench")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert 100 <= predictor.predict(PLAIN, "infobench") <= 150


def test_bad_inputs_raise():
    predictor = LengthPredictor()
    with pytest.raises(ValueError, match="unknown task"):
        predictor.predict(PLAIN, "poetry")
    with pytest.raises(ValueError, match="output_tokens"):
        predictor.observe(PLAIN, "infobench", -1)
