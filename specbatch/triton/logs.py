"""Route the library's `logging` records into Triton's log."""

from __future__ import annotations

import logging

import triton_python_backend_utils as pb_utils


class TritonLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = self.format(record)
        if record.levelno >= logging.ERROR:
            pb_utils.Logger.log_error(message)
        elif record.levelno >= logging.WARNING:
            pb_utils.Logger.log_warn(message)
        else:
            pb_utils.Logger.log_info(message)


def install(level: int = logging.INFO) -> None:
    """Send specbatch's log records to Triton once per stub process."""
    root = logging.getLogger("specbatch")
    if not any(isinstance(h, TritonLogHandler) for h in root.handlers):
        handler = TritonLogHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
