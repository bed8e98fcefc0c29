"""Locate a tritonserver binary and the environment it needs.

Inside NVIDIA's Triton container `tritonserver` is on PATH and its Python backend is
installed, so nothing has to be prepared. Everywhere else the `nvidia-pytriton` wheel
carries the same server (2.51, the one in the 24.10 container) with the Python backend
and one backend stub per Python version; the server then needs a backend directory
holding the backend library plus the stub for *this* interpreter, the wheel's bundled
shared libraries on LD_LIBRARY_PATH, and this virtualenv's `bin` first on PATH so the
stub imports the same site-packages as we do. The stub links libpython dynamically,
so the directory of *this* interpreter's libpython goes first on LD_LIBRARY_PATH too:
otherwise a system libpython of another patch release is picked up and extension
modules built for ours (ssl, for one) fail to import inside the stub.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

_STUB_NAME = "triton_python_backend_stub"


class TritonNotFoundError(RuntimeError):
    """Neither a tritonserver on PATH nor the nvidia-pytriton wheel is available."""


@dataclass(frozen=True)
class TritonInstallation:
    """How to run one tritonserver: the binary, extra arguments and environment."""

    binary: Path
    backend_directory: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def command(self, *args: str) -> list[str]:
        """The argv for tritonserver with the backend directory filled in."""
        argv = [str(self.binary)]
        if self.backend_directory is not None:
            argv.append(f"--backend-directory={self.backend_directory}")
        argv.extend(args)
        return argv

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: os.environ) with this installation's variables applied."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def _wheel_root() -> Path | None:
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def _prepare_backend_directory(wheel_root: Path, cache_dir: Path) -> Path:
    """Assemble backends/python with the stub matching the running interpreter."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = wheel_root / "python_backend_stubs" / version / _STUB_NAME
    if not stub.exists():
        raise TritonNotFoundError(f"nvidia-pytriton carries no Python backend stub for Python {version}")
    target = cache_dir / f"py{version}" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for source in [*(wheel_root / "backends" / "python").glob("*.*"), stub]:
        if source.is_dir():
            continue
        dest = target / source.name
        if not dest.exists() or dest.stat().st_mtime < source.stat().st_mtime:
            _replace_atomically(source, dest)
    return target.parent


def _replace_atomically(source: Path, dest: Path) -> None:
    """Copy beside `dest`, then rename over it: a server of another checkout may be running
    the old stub, and writing into an executable in use fails (ETXTBSY) where a rename
    does not (that server keeps its open copy)."""
    partial = dest.with_name(f".{dest.name}.{os.getpid()}")
    shutil.copy2(source, partial)
    os.replace(partial, dest)


def _libpython_dir() -> str:
    """The directory holding this interpreter's shared libpython, or '' if it is static."""
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and library and library.endswith(".so") and (Path(libdir) / library).exists():
        return libdir
    return ""


def find_tritonserver(cache_dir: Path | None = None) -> TritonInstallation:
    """The container's tritonserver if on PATH, else the one from the nvidia-pytriton wheel."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstallation(binary=Path(on_path))
    root = _wheel_root()
    if root is None:
        raise TritonNotFoundError(
            "tritonserver is not on PATH and the nvidia-pytriton wheel is not installed; "
            "run inside the Triton 24.10 container or `pip install nvidia-pytriton`"
        )
    cache_dir = cache_dir or Path(os.environ.get("SPECBATCH_CACHE", Path.home() / ".cache" / "specbatch"))
    backend_dir = _prepare_backend_directory(root, cache_dir / "triton-backends")
    libs = root.parent.parent / "nvidia_pytriton.libs"
    python_bin = str(Path(sys.executable).parent)
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(
            p for p in (_libpython_dir(), str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        "PATH": os.pathsep.join(p for p in (python_bin, os.environ.get("PATH", "")) if p),
    }
    return TritonInstallation(binary=root / "bin" / "tritonserver", backend_directory=backend_dir, env=env)
