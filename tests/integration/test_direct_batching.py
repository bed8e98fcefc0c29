"""qwen3_specdec under Triton's own dynamic batcher (configs/cpu_triton_batching.pbtxt),
the baseline the scheduler is measured against, answers each request as soon as its own
rows are done: a short request batched with a long one is not held until the long one
ends. Real tritonserver, real tritonclient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import INFOBENCH_PROMPT, GrpcStream

from specbatch.server.ports import Ports
from specbatch.server.process import ServerOptions, TritonProcess

ROOT = Path(__file__).resolve().parents[2]


def direct_inputs(max_tokens: int) -> dict:
    return {
        "mode": np.array([b"speculative"], dtype=object),
        "prompt": np.array([INFOBENCH_PROMPT.encode()], dtype=object),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
    }


def test_a_short_request_batched_with_a_long_one_is_answered_first(tmp_path):
    options = ServerOptions(
        root=ROOT,
        config_name="cpu_triton_batching",
        only_model="qwen3_specdec",
        ports=Ports.free(),
        exit_timeout_s=10,
        env={"SPECBATCH_LOOKAHEAD": "0"},
    )
    process = TritonProcess(options)
    process.start(tmp_path / "tritonserver.log")
    try:
        process.wait_ready(timeout_s=300)
        stream = GrpcStream(process.grpc_url)
        try:
            stream.send("long", direct_inputs(300), model="qwen3_specdec")
            stream.send("short", direct_inputs(2), model="qwen3_specdec")
            finals = []
            while len(finals) < 2:
                request_id, outputs, final, error = stream.next()
                assert error is None, error
                if final:
                    finals.append((request_id, outputs["num_output_tokens"][0]))
        finally:
            stream.close()
    finally:
        process.stop()
    assert finals[0] == ("short", 2)
    assert finals[1][0] == "long" and finals[1][1] > 2
