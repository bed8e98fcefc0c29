"""Shared memory a killed tritonserver left is removed; a live or young region stays."""

import mmap
import os
import time

from specbatch.server.shm_regions import REGION_PREFIX, mapped_paths, remove_stale_regions, stale_regions


def region(directory, name: str, age_s: float):
    path = directory / f"{REGION_PREFIX}{name}"
    path.write_bytes(b"\0" * 4096)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_old_regions_nothing_maps_are_stale(tmp_path):
    left = region(tmp_path, "left-by-a-killed-server", age_s=3600)
    live = region(tmp_path, "of-a-running-server", age_s=3600)
    region(tmp_path, "of-a-stub-starting-now", age_s=1)
    (tmp_path / "someone-elses-file").write_bytes(b"x")
    stale = stale_regions(tmp_path, mapped={str(live)}, now_s=time.time(), min_age_s=60)
    assert stale == [left], "the live, the young and the foreign file are not stale"


def test_a_region_this_process_maps_is_seen_as_mapped_and_kept(tmp_path):
    live = region(tmp_path, "mapped-here", age_s=3600)
    left = region(tmp_path, "unmapped", age_s=3600)
    with live.open("r+b") as file, mmap.mmap(file.fileno(), 0) as mapping:
        assert mapping[:1] == b"\0"
        assert str(live) in mapped_paths()
        assert remove_stale_regions(tmp_path, min_age_s=60) == [left]
    assert live.exists() and not left.exists()


def test_a_missing_directory_removes_nothing(tmp_path):
    assert remove_stale_regions(tmp_path / "no-such-directory") == []
