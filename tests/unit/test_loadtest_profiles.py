"""Load-test profiles: the shipped ones load, and every malformed field fails with its name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specbatch.loadtest.profiles import ProfileError, load_profile, parse_timespan

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "loadtest" / "profiles"

VALID = {
    "name": "unit",
    "workload": {
        "users": 2,
        "duration": "10s",
        "clients": {"grpc_stream": 1, "http": 1},
        "mix": {"graph": 1, "infobench": 3},
        "prompts": {"source": "generated", "count": 5, "seed": 3},
        "max_tokens": {"infobench": [4, 8], "graph": 2},
        "ignore_eos": True,
        "arrival": {"shape": "poisson", "rate": 2},
    },
    "sla": {
        "max_error_rate": 0.05,
        "tasks": {"infobench": {"ttft_p95_ms": 100, "tpot_p95_ms": 10, "e2e_p99_ms": 900}},
    },
}


def write_profile(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def changed(section: str, key: str, value: object) -> dict:
    """VALID with one key of one section replaced (value None: removed)."""
    document = yaml.safe_load(yaml.safe_dump(VALID))
    target = document
    for part in section.split(".") if section else []:
        target = target[part]
    if value is None:
        del target[key]
    else:
        target[key] = value
    return document


def test_valid_profile_is_read_with_every_field(tmp_path):
    profile = load_profile(write_profile(tmp_path, VALID))

    workload = profile.workload
    assert profile.name == "unit"
    assert workload.users == 2
    assert workload.spawn_rate == 2.0
    assert workload.duration_s == 10.0
    assert workload.active_clients == ["grpc_stream", "http"]
    assert workload.active_tasks == ["graph", "infobench"]
    assert workload.max_tokens == {"infobench": (4, 8), "graph": (2, 2)}
    assert workload.arrival.shape == "poisson" and workload.arrival.rate == 2.0
    assert workload.prompts.kind == "generated" and workload.prompts.count == 5 and workload.prompts.seed == 3
    assert workload.request_timeout_s == 60.0
    assert workload.ignore_eos is True
    assert profile.sla.max_error_rate == 0.05
    targets = profile.sla.tasks["infobench"]
    assert (targets.ttft_p95_ms, targets.tpot_p95_ms, targets.e2e_p99_ms) == (100.0, 10.0, 900.0)


@pytest.mark.parametrize("name", ["smoke", "mixed", "bursts"])
def test_shipped_profiles_load(name):
    profile = load_profile(PROFILES / f"{name}.yaml")

    assert profile.name == name
    assert profile.description
    assert set(profile.workload.active_tasks) == {"graph", "mmlu", "infobench"}
    assert set(profile.sla.tasks) == {"graph", "mmlu", "infobench"}


def test_a_profile_without_ignore_eos_lets_answers_stop_at_end_of_sequence(tmp_path):
    profile = load_profile(write_profile(tmp_path, changed("workload", "ignore_eos", None)))
    assert profile.workload.ignore_eos is False


def test_smoke_profile_fits_the_ci_budget():
    workload = load_profile(PROFILES / "smoke.yaml").workload

    assert workload.duration_s <= 20
    assert workload.arrival.shape in ("constant", "poisson")


def test_bursts_profile_has_on_and_off_phases():
    arrival = load_profile(PROFILES / "bursts.yaml").workload.arrival

    assert arrival.shape == "bursts"
    assert arrival.on_rate > arrival.off_rate
    assert (arrival.on_s, arrival.off_s) == (5.0, 10.0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20s", 20.0), ("1m30s", 90.0), ("2m", 120.0), ("1h", 3600.0), ("500ms", 0.5), (15, 15.0), (2.5, 2.5)],
)
def test_timespans(text, seconds):
    assert parse_timespan(text, "x") == seconds


@pytest.mark.parametrize("text", ["", "abc", "20", "-1s", 0, -3, True, "1x", None])
def test_bad_timespans_are_refused(text):
    with pytest.raises(ProfileError, match=r"^x must be a"):
        parse_timespan(text, "x")


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("", "description", 5, r"description must be a string, got 5"),
        ("", "name", "", r"name must be a non-empty string"),
        ("workload", "usrs", 3, r"workload: unknown key\(s\) usrs"),
        ("workload", "users", 0, r"workload\.users must be an integer >= 1, got 0"),
        ("workload", "users", 1, r"workload\.users is 1 but 2 client kinds"),
        ("workload", "mix", None, r"workload\.mix is required"),
        ("workload", "mix", {"graph": 0}, r"workload\.mix needs at least one positive weight"),
        ("workload", "mix", {"chat": 1}, r"workload\.mix: unknown key\(s\) chat"),
        ("workload", "mix", {"graph": -1}, r"workload\.mix\.graph must be non-negative"),
        ("workload", "clients", {"grpc_stream": 1.5}, r"workload\.clients\.grpc_stream must be an integer"),
        ("workload", "duration", "soon", r"workload\.duration must be a duration"),
        ("workload", "ignore_eos", "yes", r"workload\.ignore_eos must be true or false, got 'yes'"),
        ("workload", "max_tokens", {"infobench": [8, 4]}, r"workload\.max_tokens\.infobench: low 8 is above"),
        ("workload", "max_tokens", {"infobench": [1, 2, 3]}, r"an integer or a \[low, high\] pair"),
        (
            "workload",
            "max_tokens",
            {"infobench": 0},
            r"workload\.max_tokens\.infobench must be an integer >= 1",
        ),
        ("workload.arrival", "rate", -2, r"workload\.arrival\.rate must be positive"),
        (
            "workload.arrival",
            "shape",
            "ramp",
            r"workload\.arrival\.shape must be one of constant, poisson, bursts",
        ),
        ("workload.arrival", "on_duration", "5s", r"workload\.arrival: unknown key\(s\) on_duration"),
        ("workload.prompts", "source", "dataset", r"workload\.prompts\.source must be 'generated' or 'file'"),
        ("workload.prompts", "count", 0, r"workload\.prompts\.count must be an integer >= 1"),
        ("sla", "max_error_rate", 1.5, r"sla\.max_error_rate is a fraction in \[0, 1\]"),
        ("sla", "max_error_rate", None, r"sla\.max_error_rate is required"),
        (
            "sla",
            "tasks",
            {"mmlu": {"e2e_p99_ms": 10}},
            r"sla\.tasks\.mmlu: the workload mix never sends mmlu",
        ),
        ("sla", "tasks", {"graph": {"p50_ms": 10}}, r"sla\.tasks\.graph: unknown key\(s\) p50_ms"),
        ("sla", "tasks", {"graph": {"e2e_p99_ms": 0}}, r"sla\.tasks\.graph\.e2e_p99_ms must be positive"),
        (
            "sla",
            "tasks",
            {"graph": {"e2e_p99_ms": "fast"}},
            r"sla\.tasks\.graph\.e2e_p99_ms must be a number",
        ),
    ],
)
def test_bad_fields_are_named(tmp_path, section, key, value, message):
    with pytest.raises(ProfileError, match=message):
        load_profile(write_profile(tmp_path, changed(section, key, value)))


def test_bursts_need_their_phases(tmp_path):
    document = changed("workload", "arrival", {"shape": "bursts", "on_rate": 5, "on_duration": "2s"})

    with pytest.raises(ProfileError, match=r"workload\.arrival\.off_duration is required"):
        load_profile(write_profile(tmp_path, document))


def test_ttft_target_needs_the_grpc_client(tmp_path):
    document = changed("workload", "clients", {"http": 1})

    with pytest.raises(ProfileError, match="TTFT and TPOT are measured by the grpc_stream client"):
        load_profile(write_profile(tmp_path, document))


def test_missing_file_and_bad_yaml_are_profile_errors(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [unclosed\n")
    with pytest.raises(ProfileError, match="is not valid YAML"):
        load_profile(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match="must be a mapping, got list"):
        load_profile(listing)


def test_prompt_file_is_resolved_next_to_the_profile(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"text": "Instruction: Say hi.", "task": "infobench"}\n')
    document = changed("workload", "prompts", {"source": "file", "path": "prompts.jsonl"})

    profile = load_profile(write_profile(tmp_path, document))

    assert profile.workload.prompts.path == tmp_path / "prompts.jsonl"


def test_missing_prompt_file_is_named(tmp_path):
    document = changed("workload", "prompts", {"source": "file", "path": "nowhere.jsonl"})

    with pytest.raises(ProfileError, match=r"workload\.prompts\.path: no such file .*nowhere\.jsonl"):
        load_profile(write_profile(tmp_path, document))


def test_profile_error_is_a_value_error():
    assert issubclass(ProfileError, ValueError)
