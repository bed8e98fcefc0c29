"""Build the deterministic tiny Qwen3 models: the embedded default pair and the
controlled-acceptance pairs the benchmark uses. No download; idempotent.

    python scripts/build_tiny_models.py --out .models            # tiny + controlled
    python scripts/build_tiny_models.py --out .models --only tiny
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specbatch.decoding.tiny import build_benchmark_pairs, build_tiny_pair


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".models"), help="root directory for the models")
    parser.add_argument("--only", choices=("tiny", "controlled"), help="build just one group")
    parser.add_argument("--force", action="store_true", help="rebuild even if the directories exist")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.only in (None, "tiny"):
        target, draft = build_tiny_pair(args.out / "tiny", force=args.force)
        print(f"tiny pair: target={target} draft={draft}")
    if args.only in (None, "controlled"):
        for name, (target, draft) in build_benchmark_pairs(args.out / "controlled", force=args.force).items():
            print(f"controlled {name}: target={target} draft={draft}")


if __name__ == "__main__":
    main()
