"""CLI: ``python -m specbatch.scheduling.simulate EXPERIMENT --out DIR [--quick] [--seed N]``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specbatch.scheduling.simulate.experiments import EXPERIMENTS, run_experiment


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specbatch.scheduling.simulate",
        description="Run scheduling experiments in the simulators; writes JSON and PNGs.",
    )
    parser.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON and PNG files")
    parser.add_argument(
        "--quick", action="store_true", help="smaller sweeps: the whole set in under a minute"
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed of every workload (default 0)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each stage")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    started = time.perf_counter()
    outputs = run_experiment(args.experiment, args.out, quick=args.quick, seed=args.seed)
    for output in outputs:
        print(f"\n## {output.name}\n")
        for table in output.tables:
            print(table + "\n")
        print(f"JSON: {output.json_path}")
        for figure in output.figures:
            print(f"PNG:  {figure}")
    print(f"\nfinished in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
