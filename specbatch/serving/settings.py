"""Model configuration parameters, overridable by environment, failing loudly.

Every model.py reads its `parameters { key: ... }` through here. An environment
variable SPECBATCH_<KEY> (upper case) wins over the config file, so production
differs from the embedded default only by configuration. A value still holding a
`${...}` template or a required key left out is a load-time error, never a silent
default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

_TEMPLATE = re.compile(r"\$\{[^}]*\}")
SWITCH_ON = ("on", "true", "1")
SWITCH_OFF = ("off", "false", "0")


class ConfigError(ValueError):
    """The model configuration is unusable: raised from initialize() so loading fails."""


class ModelSettings:
    """Typed access to one model's parameters."""

    def __init__(
        self, model_config: Mapping, project_root: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self._env = os.environ if env is None else env
        self._root = project_root
        self._name = model_config.get("name", "?")
        self._values = {
            key: str(value.get("string_value", ""))
            for key, value in model_config.get("parameters", {}).items()
        }

    def raw(self, key: str, default: str | None = None) -> str:
        value = self._env.get(f"SPECBATCH_{key.upper()}") or self._values.get(key) or default
        if value is None:
            raise ConfigError(
                f"model '{self._name}': parameter '{key}' is required (config or SPECBATCH_{key.upper()})"
            )
        if _TEMPLATE.search(value):
            raise ConfigError(f"model '{self._name}': parameter '{key}' holds an unfilled template {value!r}")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        return self._typed(key, default, int, "an integer")

    def number(self, key: str, default: float | None = None) -> float:
        return self._typed(key, default, float, "a number")

    def switch(self, key: str, default: bool) -> bool:
        """An on/off setting: ``on``/``off`` (also ``true``/``false``, ``1``/``0``), any case."""
        value = self.raw(key, "on" if default else "off").lower()
        if value in SWITCH_ON:
            return True
        if value in SWITCH_OFF:
            return False
        raise ConfigError(f"model '{self._name}': parameter '{key}' must be on or off, got {value!r}")

    def _typed(self, key: str, default, cast, kind: str):
        value = self.raw(key, None if default is None else str(default))
        try:
            return cast(value)
        except ValueError:
            raise ConfigError(
                f"model '{self._name}': parameter '{key}' must be {kind}, got {value!r}"
            ) from None

    def model_path(self, key: str) -> str:
        """A local directory (relative paths are taken from the project root) or a hub id."""
        value = self.raw(key)
        candidate = Path(value).expanduser()
        if not candidate.is_absolute():
            candidate = self._root / candidate
        if candidate.exists():
            return str(candidate)
        if value.startswith((".", "/")):
            raise ConfigError(
                f"model '{self._name}': {key}={value!r} is not a directory; "
                "build the tiny models with `specbatch build-models` or point it at real weights"
            )
        return value


def root_of_repository(model_directory: str | Path) -> Path:
    """The checkout (or install prefix) holding model_repository/, from a model's own directory."""
    return Path(model_directory).resolve().parent.parent
