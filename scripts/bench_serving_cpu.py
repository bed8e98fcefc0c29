"""CPU seconds per request spent in the router and scheduler processes of a checkout.

Starts the checkout's pipeline (cpu config) with the checkout's own virtualenv, sends
the same streaming infobench arrivals (Poisson, below capacity) over one gRPC stream,
and reads the user + system CPU time of the router and scheduler stub processes from
/proc before and after. Run it with each checkout's interpreter to compare versions:

    .venv/bin/python scripts/bench_serving_cpu.py --out results/serving_cpu.json
    /path/to/other/.venv/bin/python scripts/bench_serving_cpu.py --root /path/to/other
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def stub_cpu_seconds(server_pid: int, prefixes: tuple[str, ...]) -> float:
    """CPU seconds so far of the server's stub processes whose instance name has a prefix."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) != server_pid or len(argv) < 9 or b"python_backend_stub" not in argv[0]:
            continue
        if argv[8].decode().startswith(prefixes):
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def drive(url: str, prompts: list[str], times: list[float], max_tokens: int) -> int:
    """Send streaming requests on time over one gRPC stream; the number answered."""
    import tritonclient.grpc as grpcclient

    finals: queue.Queue = queue.Queue()

    def callback(result, error) -> None:
        if error is not None:
            finals.put(False)
        elif result.get_response().parameters["triton_final_response"].bool_param:
            finals.put(True)

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    start = time.monotonic()

    def tensor(name: str, array: np.ndarray, datatype: str):
        value = grpcclient.InferInput(name, list(array.shape), datatype)
        value.set_data_from_numpy(array)
        return value

    for index, (at, prompt) in enumerate(zip(times, prompts, strict=True)):
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        inputs = [
            tensor("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
            tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
            tensor("task_override", np.array([[b"infobench"]], dtype=np.object_), "BYTES"),
            tensor("stream", np.array([[True]]), "BOOL"),
        ]
        client.async_stream_infer("specbatch", inputs, request_id=str(index))
    ok = sum(finals.get(timeout=300) for _ in prompts)
    client.stop_stream()
    client.close()
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root))
    from specbatch.routing import build_infobench_prompt, generate_workload
    from specbatch.server.ports import Ports
    from specbatch.server.process import ServerOptions, TritonProcess

    rng = random.Random(0)
    times, now = [], 0.0
    while (now := now + rng.expovariate(args.rate)) < args.duration:
        times.append(now)
    prompts = [
        build_infobench_prompt(p.text) for p in generate_workload(len(times), 0, mix={"infobench": 1.0})
    ]
    options = ServerOptions(
        root=args.root, config_name="cpu", ports=Ports.free(), host="127.0.0.1", exit_timeout_s=5
    )
    process = TritonProcess(options)
    process.start(Path(tempfile.mkdtemp(prefix="serving_cpu_")) / "server.log")
    try:
        process.wait_ready(300)
        url = f"127.0.0.1:{options.ports.grpc}"
        drive(url, prompts[:4], [0.0] * 4, args.max_tokens)
        prefixes = ("router_", "scheduler_")
        before = stub_cpu_seconds(process.process.pid, prefixes)
        answered = drive(url, prompts, times, args.max_tokens)
        cpu = stub_cpu_seconds(process.process.pid, prefixes) - before
    finally:
        process.stop()
    row = {
        "root": str(args.root),
        "requests": len(prompts),
        "answered": answered,
        "router_scheduler_cpu_s": cpu,
        "cpu_ms_per_request": 1000 * cpu / len(prompts),
    }
    print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
