"""Shared-memory regions left behind by a tritonserver that was killed.

Triton's Python backend passes tensors to each stub process through a file of its own in
/dev/shm (`triton_python_backend_shm_region_<uuid>`, 1 MiB and growing with the
tensors). A server that stops cleanly removes them; one killed (kill -9, the OOM killer,
a crash) leaves every stub's region behind, and a supervisor that starts it again adds a
new set. In a container, /dev/shm is memory the pod is charged for and keeps across
restarts (Docker's default is 64 MiB; the Kubernetes pod's is an 8 GiB memory-backed
emptyDir), so each crash and restart keeps a few MiB more until the backend can no
longer create a region. A region is removed before tritonserver starts only where no
process maps it and it is over a minute old (a stub maps its region as soon as it is
launched), so a live server's regions, and those of one starting beside it, stay.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

SHM_DIRECTORY = Path("/dev/shm")
REGION_PREFIX = "triton_python_backend_shm_region_"
MIN_AGE_S = 60.0  # a younger region may be one a starting stub has not mapped yet


def mapped_paths(proc: Path = Path("/proc")) -> set[str]:
    """Every file some process this user can inspect has mapped. A process of another
    user is skipped: it cannot map this user's regions for writing, as the backend does."""
    paths: set[str] = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone since the listing, or another user's
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6:
                paths.add(fields[5].removesuffix(" (deleted)"))
    return paths


def stale_regions(directory: Path, mapped: Iterable[str], now_s: float, min_age_s: float) -> list[Path]:
    """This user's Python-backend regions in ``directory`` that nothing maps and that were
    last resized over ``min_age_s`` ago."""
    in_use = set(mapped)
    stale = []
    for path in sorted(directory.glob(f"{REGION_PREFIX}*")):
        try:
            status = path.stat()
        except OSError:
            continue
        if status.st_uid != os.getuid() or str(path) in in_use:
            continue
        if now_s - status.st_mtime > min_age_s:
            stale.append(path)
    return stale


def remove_stale_regions(directory: Path = SHM_DIRECTORY, min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Remove the regions killed servers left (see the module docstring); what was removed."""
    if not directory.is_dir():
        return []
    removed = []
    for path in stale_regions(directory, mapped_paths(), time.time(), min_age_s):
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            continue
        removed.append(path)
        logger.info("removed %s (%d KiB): a killed tritonserver's shared memory", path.name, size // 1024)
    return removed
