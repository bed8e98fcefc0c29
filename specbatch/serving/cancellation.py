"""A per-server board of cancelled rows, shared by the scheduler and the model instances.

Triton 24.10's Python backend cannot cancel a BLS request once sent, yet a cancelled or
expired prompt must leave its running batch within one decode step. The scheduler and
every qwen3_specdec instance are stub processes of the same tritonserver, so they share
a directory in shared memory named after that server's process id: the scheduler drops
a marker file per cancelled row, the instance checks its rows' markers between steps
(one stat call each), and the scheduler removes the marker once the batch is back.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


class CancelBoard:
    """Marker files under one directory; row ids are short ASCII names."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_server(cls, server_pid: int | None = None) -> CancelBoard:
        """The board of the tritonserver that started this stub (its parent process)."""
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        return cls(base / f"specbatch-cancel-{server_pid or os.getppid()}")

    def _marker(self, row_id: str) -> Path:
        if not _SAFE_ID.match(row_id):
            raise ValueError(f"row id {row_id!r} is not a plain name")
        return self.root / row_id

    def cancel(self, row_id: str) -> None:
        self._marker(row_id).touch()

    def is_cancelled(self, row_id: str) -> bool:
        return bool(row_id) and self._marker(row_id).exists()

    def clear(self, row_id: str) -> None:
        self._marker(row_id).unlink(missing_ok=True)

    def reset(self) -> None:
        """Forget every marker (the scheduler does this when it starts)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
