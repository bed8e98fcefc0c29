"""Small helpers the integration tests share: metrics scraping and prompt fixtures."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

GRAPH_PROMPT = (
    "You are given a directed graph with 5 nodes (numbered 0 to 4) and the following edges:\n"
    "Edges (source -> target, weight):\n"
    "0 -> 1, weight: 4\n0 -> 2, weight: 1\n2 -> 1, weight: 2\n"
    "1 -> 3, weight: 1\n2 -> 3, weight: 5\n3 -> 4, weight: 3\n"
    "Find the top 2 shortest path(s) from node 0 to node 4.\n"
    "Return your answer by calling submit_paths(paths=[[...], ...], weights=[...])."
)
GRAPH_ANSWER = "submit_paths(paths=[[0, 2, 1, 3, 4], [0, 1, 3, 4]], weights=[7, 8])"

MMLU_PROMPT = (
    "The following is a multiple choice question (with answers) about clinical knowledge.  "
    'Output the answer in the format of "The answer is (X)" at the end.\n\n'
    "Question: Which vitamin deficiency causes scurvy?\n Options:\n"
    "A. Vitamin A\nB. Vitamin B12\nC. Vitamin C\nD. Vitamin D\nAnswer:"
)
MMLU_DATASET_PROMPT = (
    "Question:\nWhich organ produces insulin?\n\nChoices:\n"
    "A. Liver\nB. Pancreas\nC. Kidney\nD. Spleen\nE. Heart"
)
INFOBENCH_PROMPT = "Instruction: Write a short note thanking a colleague.\nQuestion: \nGeneration:"
# A prompt the tiny pair answers with end-of-sequence after 8 tokens (greedy)
SEA_PROMPT = "Instruction: Write about the sea.\nQuestion: \nGeneration:"
# A first-token SLA no test's queueing can miss on a loaded 2-core machine. The server's
# 2 s default makes admission refuse a prompt predicted to wait longer; tests about
# something else (batching, faults, shutdown) must not depend on how fast the machine
# runs that day. Tests of refusal start their own server with their own bounds.
PATIENT_SLA = {"SPECBATCH_SLA_TTFT_MS": "600000"}
INFOBENCH_DATASET_PROMPT = (
    "Summarize the following paragraph in one sentence.\n\nThe clinic opened a new wing last year."
)


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        return reply.read().decode()


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label string: value} for every sample of metric `name`."""
    values = {}
    for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", text, re.MULTILINE):
        values[match.group(1) or ""] = float(match.group(2))
    return values


def grpc_generate(url: str, inputs: dict, timeout_s: float = 300.0) -> tuple[dict, str | None]:
    """One request on the gRPC stream (flat inputs, sent as one batch entry): (outputs, error or None)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, flat in inputs.items():
        array = flat.reshape(1, -1)
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        client.async_stream_infer("specbatch", tensors)
        result, error = replies.get(timeout=timeout_s)
    finally:
        client.stop_stream()
        client.close()
    if error is not None:
        return {}, error.message()
    outputs = {}
    for output in result.get_response().outputs:
        array = result.as_numpy(output.name)
        outputs[output.name] = [v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)]
    return outputs, None


class GrpcStream:
    """A gRPC stream kept open across requests, collecting every response by request id."""

    def __init__(self, url: str) -> None:
        import queue

        import tritonclient.grpc as grpcclient

        self._grpcclient = grpcclient
        self.replies: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)))

    def send(
        self, request_id: str, inputs: dict, timeout_us: int | None = None, model: str = "specbatch"
    ) -> None:
        import numpy as np
        from tritonclient.utils import np_to_triton_dtype

        tensors = []
        for name, flat in inputs.items():
            array = flat.reshape(1, -1)
            datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
            tensor = self._grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        kwargs = {"timeout": timeout_us} if timeout_us else {}
        self.client.async_stream_infer(model, tensors, request_id=request_id, **kwargs)

    def next(self, timeout_s: float = 120.0) -> tuple[str, dict, bool, str | None]:
        """(request id, outputs, final?, error message) of the next response."""
        result, error = self.replies.get(timeout=timeout_s)
        if error is not None:
            return "", {}, True, error.message()
        response = result.get_response()
        outputs = {}
        for output in response.outputs:
            array = result.as_numpy(output.name)
            outputs[output.name] = [
                v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)
            ]
        final = response.parameters["triton_final_response"].bool_param
        return response.id, outputs, final, None

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def long_requests_on_a_stream(url: str, count: int, max_tokens: int = 400) -> GrpcStream:
    """One gRPC stream carrying ``count`` long infobench requests."""
    import numpy as np

    stream = GrpcStream(url)
    for index in range(count):
        inputs = {
            "text_input": np.array([INFOBENCH_PROMPT], dtype=object),
            "max_tokens": np.array([max_tokens], dtype=np.int32),
        }
        stream.send(f"long-{index}", inputs)
    return stream


def final_answers(stream: GrpcStream, count: int, timeout_s: float = 120.0) -> list[str | None]:
    """The error message (None when served) of the next ``count`` final responses on ``stream``."""
    finals = []
    while len(finals) < count:
        _, _, final, error = stream.next(timeout_s)
        if final:
            finals.append(error)
    return finals


@contextlib.contextmanager
def running_server(
    log: Path, env: dict[str, str], exit_timeout_s: int = 10, as_in_a_pod: str | None = None
) -> Iterator:
    """The whole pipeline (cpu config, tiny pair) on free loopback ports with ``env``;
    stopped by its process id, with its stub processes, whatever happens. ``as_in_a_pod``:
    as deploy/ runs it, nothing but the pod's own processes bring back dead stubs: in
    "kubernetes" the gateway (a shared process namespace), in "kserve" `specbatch watch`
    in tritonserver's container."""
    from specbatch.server.ports import Ports
    from specbatch.server.process import ServerOptions, TritonProcess

    root = Path(__file__).resolve().parents[2]
    options = ServerOptions(
        root=root,
        config_name="cpu",
        ports=Ports.free(),
        host="127.0.0.1",
        exit_timeout_s=exit_timeout_s,
        env=env,
        gateway_supervises=as_in_a_pod == "kubernetes",
        watched_in_container=as_in_a_pod == "kserve",
    )
    process = TritonProcess(options)
    process.start(log)
    try:
        process.wait_ready(timeout_s=300)
        if not as_in_a_pod:
            process.supervise()
        yield process
    finally:
        process.stop()
        print(f"tritonserver log: {log}")


def post_generate(http_url: str, max_tokens: int, prompt: str = INFOBENCH_PROMPT) -> tuple[int, str]:
    """(HTTP status, body) of one `/generate` of ``prompt``."""
    body = json.dumps({"text_input": [prompt], "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://{http_url}/v2/models/specbatch/generate", data=body)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def is_ready(http_url: str) -> bool:
    """What `/v2/health/ready` says (through the gateway: 200 or 503)."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=30) as reply:
            return reply.status == 200
    except urllib.error.HTTPError:
        return False


def running_rows(metrics_url: str) -> float:
    return sum(metric_values(scrape(metrics_url), "specbatch_running_rows").values())


def stub_pid(triton_pid: int, instance: str) -> int:
    """The pid of the stub process of ``instance`` (e.g. scheduler_0_0) of a tritonserver."""
    from specbatch.server.stubs import stubs_of

    [pid] = [pid for pid, name in stubs_of(triton_pid).items() if name == instance]
    return pid


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (stubs, their solver workers and watchers, ...)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
