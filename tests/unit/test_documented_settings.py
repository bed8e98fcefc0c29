"""Every `SPECBATCH_*` variable the documentation names is read by something: either by
name, or as `SPECBATCH_<PARAMETER>` overriding a model config parameter the code reads.
A documented setting that nothing reads would be silently ignored."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
SOURCES = [*(ROOT / "specbatch").rglob("*.py"), *(ROOT / "model_repository").rglob("*.py")]


def documented() -> set[str]:
    return {name for doc in DOCS for name in re.findall(r"SPECBATCH_[A-Z0-9_]*[A-Z0-9]", doc.read_text())}


def test_every_documented_variable_is_read():
    code = "\n".join(path.read_text() for path in SOURCES)
    configs = "\n".join(path.read_text() for path in (ROOT / "model_repository").rglob("*.pbtxt"))
    unread = []
    for name in sorted(documented()):
        parameter = name.removeprefix("SPECBATCH_").lower()
        by_name = f'"{name}"' in code
        as_parameter = f'key: "{parameter}"' in configs and f'"{parameter}"' in code
        if not (by_name or as_parameter):
            unread.append(name)
    assert documented() and not unread, f"documented but never read: {unread}"
