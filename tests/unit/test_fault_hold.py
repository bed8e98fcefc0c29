"""The hold fault: a marked row's engine step waits for the release file, then goes on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from specbatch.serving.faults import InjectedFault, PromptFaults, held_file

HELD = "a prompt [[fault:hold]]"


def test_a_held_step_says_so_waits_for_the_release_file_and_then_returns(tmp_path: Path):
    release = tmp_path / "release"
    faults = PromptFaults(release)
    faults.row_started(3, HELD)
    step = threading.Thread(target=faults.before_step, args=({3},))
    step.start()
    announced = held_file(release, os.getpid())
    while not announced.exists():
        assert step.is_alive()
        step.join(timeout=0.01)
    assert step.is_alive()
    release.touch()
    step.join(timeout=30)
    assert not step.is_alive()


def test_only_the_marked_row_is_held(tmp_path: Path):
    faults = PromptFaults(tmp_path / "never")
    faults.row_started(1, HELD)
    faults.row_started(2, "a prompt")
    faults.before_step({2})
    faults.row_ended(1)
    faults.before_step({1, 2})


def test_a_hold_without_a_release_file_fails_the_step_instead_of_hanging():
    faults = PromptFaults()
    faults.row_started(0, HELD)
    with pytest.raises(InjectedFault, match="SPECBATCH_FAULT_RELEASE"):
        faults.before_step({0})


def test_after_the_release_a_marked_rows_steps_run_without_announcing_a_hold(tmp_path: Path):
    release = tmp_path / "release"
    release.touch()
    faults = PromptFaults(release)
    faults.row_started(0, HELD)
    faults.before_step({0})
    faults.before_step({0})
    assert not held_file(release, os.getpid()).exists()
