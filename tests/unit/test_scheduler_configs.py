"""Every parameter the scheduler reads is written out in each of its shipped configs, at
its default where nothing else is wanted: a user tuning the server reads the config, and
a switch that appears nowhere in it is one nobody finds."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READERS = [
    ROOT / "specbatch" / "serving" / "scheduler" / "setup.py",
    ROOT / "model_repository" / "scheduler" / "1" / "model.py",
]
CONFIGS = [
    ROOT / "model_repository" / "scheduler" / "config.pbtxt",
    *(ROOT / "model_repository" / "scheduler" / "configs").glob("*.pbtxt"),
]


def read_parameters() -> set[str]:
    reader = r"(?:settings\.(?:raw|integer|number|switch|model_path)\(|optional_seconds\(settings,)"
    pattern = reader + r'\s*"([a-z0-9_]+)"'
    return {key for path in READERS for key in re.findall(pattern, path.read_text())}


def test_the_scheduler_reads_parameters():
    assert {
        "admission",
        "b_mem",
        "sla_finish_base_ms",
        "sla_finish_per_token_ms",
        "cancel_poll_ms",
    } <= read_parameters()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_parameter_the_scheduler_reads_is_in_its_config(config: Path):
    listed = set(re.findall(r'parameters \{ key: "([a-z0-9_]+)"', config.read_text()))
    assert not read_parameters() - listed, f"{config.name} leaves out {sorted(read_parameters() - listed)}"
