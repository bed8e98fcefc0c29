"""The graph solver pool: answers off the event loop, a time limit that kills runaway solves,
bounded concurrency, and a pool that keeps serving after a timeout, a cancellation or a crash."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from specbatch.routing import (
    GraphError,
    GraphLimitError,
    GraphSolverPool,
    GraphTimeoutError,
    SolverBusyError,
    SolverUnavailableError,
    solve_graph,
)

SIMPLE = (
    "You are given a directed graph with 5 nodes (numbered 0 to 4) and the following edges:\n"
    "Edges (source -> target, weight):\n"
    "0 -> 1, weight: 4\n0 -> 2, weight: 1\n2 -> 1, weight: 2\n"
    "1 -> 3, weight: 1\n2 -> 3, weight: 5\n3 -> 4, weight: 3\n"
    "Find the top 2 shortest path(s) from node 0 to node 4.\n"
    "Return your answer by calling submit_paths(paths=[[...], ...], weights=[...])."
)
SIMPLE_ANSWER = "submit_paths(paths=[[0, 2, 1, 3, 4], [0, 1, 3, 4]], weights=[7, 8])"


def zero_weight_clique(k: int = 14) -> str:
    """A 16-node, 211-edge graph with P = 1, far inside every size limit, whose spur search
    walks every simple path of a zero-weight clique before it finds the direct edge:
    (k-1)! steps, years for k = 14."""
    n, target = k + 2, k + 1
    clique = range(1, k + 1)
    edges = [(0, i) for i in clique] + [(i, j) for i in clique for j in clique if i != j]
    edges += [(i, 0) for i in clique] + [(0, target)]
    lines = "\n".join(f"{a} -> {b}, weight: 0" for a, b in edges)
    return (
        f"You are given a directed graph with {n} nodes (numbered 0 to {n - 1}) and the following edges:\n"
        f"Edges (source -> target, weight):\n{lines}\n"
        f"Find the top 1 shortest path(s) from node 0 to node {target}.\n"
        "Return your answer by calling submit_paths(paths=[[...], ...], weights=[...])."
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


async def until(condition) -> None:
    """Yield to the loop until `condition()` holds (the pool's own state, no wall-clock wait)."""
    while not condition():
        await asyncio.sleep(0)


def test_answers_match_the_in_process_solver():
    async def main():
        async with GraphSolverPool(workers=2) as pool:
            return await asyncio.gather(*(pool.solve(SIMPLE) for _ in range(5)))

    assert run(main()) == [SIMPLE_ANSWER] * 5 == [solve_graph(SIMPLE)] * 5


def test_prompt_errors_keep_their_class_and_message():
    async def main():
        async with GraphSolverPool(workers=1) as pool:
            with pytest.raises(GraphLimitError, match="between 1 and 100, got 500"):
                await pool.solve(SIMPLE.replace("top 2", "top 500"))
            with pytest.raises(GraphError, match="cannot read"):
                await pool.solve(SIMPLE.replace("weight: 1\n", "weight: one\n", 1))
            assert await pool.solve(SIMPLE) == SIMPLE_ANSWER
            assert pool.restarts == 0

    run(main())


def test_a_pathological_graph_times_out_and_the_pool_keeps_serving():
    async def main():
        async with GraphSolverPool(workers=1, timeout_s=1.0) as pool:
            [worker] = pool._workers
            stuck = worker.process.pid
            with pytest.raises(GraphTimeoutError, match="not solved within the 1 s limit"):
                await pool.solve(zero_weight_clique())
            assert not alive(stuck), "the runaway worker was not killed"
            assert await pool.solve(SIMPLE) == SIMPLE_ANSWER
            assert pool.restarts == 1 and worker.process.pid != stuck

    run(main())


def test_the_timeout_is_a_prompt_error():
    assert issubclass(GraphTimeoutError, GraphLimitError) and issubclass(GraphTimeoutError, ValueError)
    assert not issubclass(SolverBusyError, ValueError)


def test_the_event_loop_keeps_running_while_a_graph_is_solved():
    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async with GraphSolverPool(workers=1, timeout_s=1.0) as pool:
            task = asyncio.create_task(ticker())
            with pytest.raises(GraphTimeoutError):
                await pool.solve(zero_weight_clique())
            task.cancel()
        # The loop ran other work throughout the one-second solve; in-process it would have none.
        assert ticks >= 10

    run(main())


def test_concurrency_is_bounded_and_overload_is_refused_at_once():
    async def main():
        async with GraphSolverPool(workers=1, timeout_s=1.0, max_waiting=1) as pool:
            slow = asyncio.create_task(pool.solve(zero_weight_clique()))
            await until(lambda: pool.busy == 1)
            queued = asyncio.create_task(pool.solve(SIMPLE))
            await until(lambda: pool.waiting == 1)
            with pytest.raises(SolverBusyError, match="1 prompts solving and 1 waiting"):
                await pool.solve(SIMPLE)
            with pytest.raises(GraphTimeoutError):
                await slow
            assert await queued == SIMPLE_ANSWER
            assert pool.busy == 0 and pool.waiting == 0

    run(main())


def test_a_cancelled_solve_replaces_its_worker():
    async def main():
        async with GraphSolverPool(workers=1, timeout_s=30.0) as pool:
            [worker] = pool._workers
            stuck = worker.process.pid
            task = asyncio.create_task(pool.solve(zero_weight_clique()))
            await until(lambda: pool.busy == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not alive(stuck)
            assert await pool.solve(SIMPLE) == SIMPLE_ANSWER

    run(main())


def test_a_worker_that_dies_fails_only_its_prompt():
    async def main():
        async with GraphSolverPool(workers=1, timeout_s=30.0) as pool:
            [worker] = pool._workers
            task = asyncio.create_task(pool.solve(zero_weight_clique()))
            await until(lambda: pool.busy == 1)
            os.kill(worker.process.pid, signal.SIGKILL)
            with pytest.raises(SolverUnavailableError, match="exited"):
                await task
            assert await pool.solve(SIMPLE) == SIMPLE_ANSWER

    run(main())


def test_close_ends_every_worker_and_refuses_new_prompts():
    async def main():
        pool = GraphSolverPool(workers=2)
        await pool.start()
        pids = [worker.process.pid for worker in pool._workers]
        await pool.close()
        assert not any(alive(pid) for pid in pids)
        with pytest.raises(SolverUnavailableError, match="shut down"):
            await pool.solve(SIMPLE)

    run(main())


def test_bad_settings_fail_loudly():
    with pytest.raises(ValueError, match="workers >= 1"):
        GraphSolverPool(workers=0)
