"""`admission: multibin` in a real tritonserver: prompts of different predicted lengths
are batched by length bin, an instance takes its next batch only when its batch has
left, a part-filled bin is flushed, and every request gets its one answer with the
tokens it asked for. Real tritonclient over gRPC."""

from __future__ import annotations

import numpy as np
from helpers import INFOBENCH_PROMPT, PATIENT_SLA, GrpcStream, running_server

LENGTHS = (3, 40, 5, 36, 4, 38, 6)  # two bins' worth, neither a full batch of 4


def test_every_request_is_answered_once_with_its_tokens_under_multibin(tmp_path):
    env = {
        "SPECBATCH_ADMISSION": "multibin",
        "SPECBATCH_NUM_BINS": "2",
        "SPECBATCH_BATCH_SIZE_MAX": "4",
        "SPECBATCH_MULTIBIN_FLUSH_MS": "200",
        "SPECBATCH_MAX_TOKENS_CAP": "64",
        "SPECBATCH_GENERATION_MODE": "target_only",
        **PATIENT_SLA,
    }
    with running_server(tmp_path / "server.log", env) as server:
        stream = GrpcStream(server.grpc_url)
        try:
            for index, max_tokens in enumerate(LENGTHS):
                inputs = {
                    "text_input": np.array([INFOBENCH_PROMPT], dtype=object),
                    "max_tokens": np.array([max_tokens], dtype=np.int32),
                    "task_override": np.array(["infobench"], dtype=object),
                }
                stream.send(str(index), inputs)
            finals: dict[str, tuple[int, str | None]] = {}
            while len(finals) < len(LENGTHS):
                request_id, outputs, final, error = stream.next()
                if final:
                    assert request_id not in finals, "one final answer per request"
                    finals[request_id] = (outputs.get("num_output_tokens", [0])[0], error)
        finally:
            stream.close()
    assert all(error is None for _, error in finals.values()), finals
    produced = [finals[str(i)][0] for i in range(len(LENGTHS))]
    assert all(0 < n <= cap for n, cap in zip(produced, LENGTHS, strict=True)), produced
