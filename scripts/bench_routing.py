"""Routing benchmark: accuracy and time per prompt on the generated mixed workload.

Measures, on one seeded workload, the structural classifier next to a keyword router
(the approach DESIGN §3 warns against), the graph solver and the mmlu parser against
the workload's expected answers, the length predictor, and Yen on a dense 20-node graph.
Prints a markdown table; ``--out FILE`` also writes the figures as JSON.

    python scripts/bench_routing.py --n 10000 --seed 0 --out bench_routing.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from specbatch.routing import (
    LengthPredictor,
    WorkloadPrompt,
    classify,
    generate_workload,
    parse_mmlu,
    route_evidence,
    solve_graph,
)

logger = logging.getLogger("bench_routing")


def keyword_router(prompt: str) -> str:
    """The single-phrase router DESIGN §3 describes as the thing not to build."""
    lower = prompt.lower()
    if "submit_paths" in lower:
        return "graph"
    if "multiple choice" in lower:
        return "mmlu"
    return "infobench"


def timed(function: Callable[[Any], Any], items: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """Results and per-call times in microseconds (after one warm-up pass over 100 items)."""
    for item in items[:100]:
        function(item)
    results, micros = [], []
    for item in items:
        start = time.perf_counter_ns()
        results.append(function(item))
        micros.append((time.perf_counter_ns() - start) / 1000)
    return results, micros


def summary(name: str, correct: int, total: int, micros: list[float]) -> dict[str, Any]:
    ordered = sorted(micros)
    return {
        "stage": name,
        "prompts": total,
        "accuracy": correct / total if total else None,
        "median_us": statistics.median(ordered),
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def dense_graph_prompt(seed: int, nodes: int = 20, paths: int = 5) -> str:
    rng = random.Random(seed)
    edges = "\n".join(
        f"{u} -> {v}, weight: {rng.randint(1, 100)}" for u in range(nodes) for v in range(nodes) if u != v
    )
    return (
        f"You are given a directed graph with {nodes} nodes (numbered 0 to {nodes - 1}) and the following "
        f"edges:\n\nEdges (source -> target, weight):\n{edges}\n\nFind the top {paths} shortest paths from "
        f"node 0 to node {nodes - 1}.\n\nReturn your answer by calling the submit_paths function."
    )


def safe(function: Callable[[str], Any]) -> Callable[[str], Any]:
    def wrapped(text: str) -> Any:
        try:
            return function(text)
        except ValueError as error:
            return error

    return wrapped


def run(n: int, seed: int) -> dict[str, Any]:
    logger.info("generating %d prompts (seed %d)", n, seed)
    workload: list[WorkloadPrompt] = generate_workload(n, seed)
    texts = [prompt.text for prompt in workload]

    logger.info("classifying")
    predicted, classify_us = timed(classify, texts)
    keyword_predicted, keyword_us = timed(keyword_router, texts)
    ambiguous = sum(route_evidence(text).decision is None for text in texts)
    by_rendering: Counter[tuple[str, str]] = Counter()
    wrong_by_rendering: Counter[tuple[str, str]] = Counter()
    keyword_wrong_by_rendering: Counter[tuple[str, str]] = Counter()
    for prompt, task, keyword_task in zip(workload, predicted, keyword_predicted, strict=True):
        key = (prompt.task, prompt.rendering)
        by_rendering[key] += 1
        wrong_by_rendering[key] += task != prompt.task
        keyword_wrong_by_rendering[key] += keyword_task != prompt.task

    logger.info("solving graph prompts and parsing mmlu prompts")
    graphs = [prompt for prompt in workload if prompt.task == "graph"]
    answers, graph_us = timed(safe(solve_graph), [prompt.text for prompt in graphs])
    questions = [prompt for prompt in workload if prompt.task == "mmlu"]
    parsed, mmlu_us = timed(safe(parse_mmlu), [prompt.text for prompt in questions])

    logger.info("predicting lengths")
    predictor = LengthPredictor()
    _, length_us = timed(lambda item: predictor.predict(*item), [(p.text, p.task) for p in workload])

    logger.info("solving dense 20-node graphs, P = 5")
    dense = [dense_graph_prompt(s) for s in range(50)]
    _, dense_us = timed(solve_graph, dense * 3)

    rows = [
        summary("classify (structural)", sum(p == w.task for p, w in zip(predicted, workload, strict=True)),
                n, classify_us),
        summary("classify (keyword baseline)",
                sum(p == w.task for p, w in zip(keyword_predicted, workload, strict=True)), n, keyword_us),
        summary("solve_graph (exact answer)",
                sum(a == g.expected for a, g in zip(answers, graphs, strict=True)), len(graphs), graph_us),
        summary("parse_mmlu (labels)",
                sum(not isinstance(q, ValueError) and q.labels == p.expected
                    for q, p in zip(parsed, questions, strict=True)),
                len(questions), mmlu_us),
        summary("LengthPredictor.predict", n, n, length_us),
        summary("solve_graph, dense 20 nodes, P = 5", len(dense) * 3, len(dense) * 3, dense_us),
    ]
    rows[-2]["accuracy"] = None
    rows[-1]["accuracy"] = None
    per_rendering = [
        {
            "task": task,
            "rendering": rendering,
            "prompts": count,
            "structural_accuracy": 1 - wrong_by_rendering[(task, rendering)] / count,
            "keyword_accuracy": 1 - keyword_wrong_by_rendering[(task, rendering)] / count,
        }
        for (task, rendering), count in sorted(by_rendering.items())
    ]
    return {
        "n": n,
        "seed": seed,
        "ambiguous_prompts": ambiguous,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "rows": rows,
        "per_rendering": per_rendering,
    }


def markdown(result: dict[str, Any]) -> str:
    def percent(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.2f} %"

    lines = [
        "| stage | prompts | accuracy | median µs | p99 µs |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['stage']} | {row['prompts']} | {percent(row['accuracy'])} | "
            f"{row['median_us']:.1f} | {row['p99_us']:.1f} |"
        )
    lines += [
        "",
        "| task | rendering | prompts | structural | keyword baseline |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["per_rendering"]:
        lines.append(
            f"| {row['task']} | {row['rendering']} | {row['prompts']} | "
            f"{percent(row['structural_accuracy'])} | {percent(row['keyword_accuracy'])} |"
        )
    lines.append("")
    lines.append(
        f"{result['ambiguous_prompts']} of {result['n']} prompts were ambiguous by structure "
        "(sent to the fallback in service; counted here as routed without one, to infobench)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="prompts in the generated workload")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = run(args.n, args.seed)
    print(markdown(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
        logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
