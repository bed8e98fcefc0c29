"""Finding tritonserver, choosing the config variant, reading model settings."""

import os
import signal
import sys
from pathlib import Path

import pytest

from specbatch.server.binary import find_tritonserver
from specbatch.server.launcher import choose_config, project_root
from specbatch.server.ports import Ports, free_port
from specbatch.server.process import ServerOptions
from specbatch.serving.settings import ConfigError, ModelSettings

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installation_has_a_backend_directory_with_this_pythons_stub(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    installation = find_tritonserver(cache_dir=tmp_path)
    assert installation.binary.name == "tritonserver" and installation.binary.exists()
    backend = installation.backend_directory / "python"
    assert {p.name for p in backend.iterdir()} >= {"libtriton_python.so", "triton_python_backend_stub"}
    env = installation.environment({})
    assert "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"]
    assert env["PATH"].split(":")[0].endswith("bin")
    assert installation.command("--help")[1] == f"--backend-directory={installation.backend_directory}"


def test_server_options_pass_both_repositories_and_the_variant():
    options = ServerOptions(root=ROOT, config_name="cpu", ports=Ports(1, 2, 3))
    args = options.arguments()
    assert f"--model-repository={ROOT / 'model_repository'}" in args
    assert f"--model-repository={ROOT / 'ensemble'}" in args
    assert "--model-config-name=cpu" in args
    for listener in ("http", "grpc", "metrics"):  # Triton's own, on loopback behind the gateway
        assert f"--{listener}-address=127.0.0.1" in args
    assert f"--http-port={options.triton_http_port}" in args
    assert f"--grpc-port={options.triton_grpc_port}" in args
    assert f"--metrics-port={options.triton_metrics_port}" in args
    gateway = options.gateway().command()
    assert f"--listen=1=127.0.0.1:{options.triton_http_port}" in gateway
    assert f"--listen-grpc=2=127.0.0.1:{options.triton_grpc_port}" in gateway
    assert f"--listen=3=127.0.0.1:{options.triton_metrics_port}" in gateway
    assert not any(a.startswith("--model-config-name") for a in ServerOptions(root=ROOT).arguments())


def test_config_choice():
    assert choose_config("default") is None
    assert choose_config("gpu1") == "gpu1"
    assert choose_config("auto") == "cpu"
    with pytest.raises(ValueError, match="unknown config"):
        choose_config("tpu")


def test_project_root_is_found_from_a_subdirectory():
    assert project_root(ROOT / "tests" / "unit") == ROOT


def test_free_ports_differ():
    assert len({free_port() for _ in range(5)}) == 5


def test_settings_env_overrides_and_loud_failures(tmp_path):
    config = {
        "name": "qwen3_specdec",
        "parameters": {
            "target_model": {"string_value": ".models/missing"},
            "draft_model": {"string_value": "${draft_model}"},
            "lookahead": {"string_value": "four"},
        },
    }
    settings = ModelSettings(config, tmp_path, env={"SPECBATCH_DTYPE": "bfloat16"})
    assert settings.raw("dtype") == "bfloat16"
    with pytest.raises(ConfigError, match="unfilled template"):
        settings.raw("draft_model")
    with pytest.raises(ConfigError, match="must be an integer"):
        settings.integer("lookahead")
    with pytest.raises(ConfigError, match="not a directory"):
        settings.model_path("target_model")
    with pytest.raises(ConfigError, match="required"):
        settings.raw("kv_memory_budget_gb")
    assert settings.switch("prefix_caching", True) is True
    switched = ModelSettings(config, tmp_path, env={"SPECBATCH_PREFIX_CACHING": "Off"})
    assert switched.switch("prefix_caching", True) is False
    unclear = ModelSettings(config, tmp_path, env={"SPECBATCH_PREFIX_CACHING": "maybe"})
    with pytest.raises(ConfigError, match="must be on or off"):
        unclear.switch("prefix_caching", True)
    (tmp_path / "weights").mkdir()
    env = {"SPECBATCH_TARGET_MODEL": "weights", "SPECBATCH_DRAFT_MODEL": "Qwen/Qwen3-0.6B"}
    overridden = ModelSettings(config, tmp_path, env=env)
    assert overridden.model_path("target_model") == str(tmp_path / "weights")
    assert overridden.model_path("draft_model") == "Qwen/Qwen3-0.6B"


def test_a_newer_stub_replaces_one_a_running_server_is_executing(tmp_path):
    """Two checkouts share the backend cache: refreshing it must not fail with ETXTBSY."""
    import shutil
    import subprocess

    from specbatch.server.binary import _STUB_NAME, _prepare_backend_directory

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheel = tmp_path / "wheel"
    (wheel / "backends" / "python").mkdir(parents=True)
    (wheel / "backends" / "python" / "libtriton_python.so").write_bytes(b"backend")
    (wheel / "python_backend_stubs" / version).mkdir(parents=True)
    stub = wheel / "python_backend_stubs" / version / _STUB_NAME
    shutil.copy2(shutil.which("sleep"), stub)
    backends = _prepare_backend_directory(wheel, tmp_path / "cache")
    running = subprocess.Popen([str(backends / "python" / _STUB_NAME), "60"])
    try:
        os.utime(stub, (stub.stat().st_atime, stub.stat().st_mtime + 10))
        assert _prepare_backend_directory(wheel, tmp_path / "cache") == backends
        assert (backends / "python" / _STUB_NAME).stat().st_mtime == stub.stat().st_mtime
        assert running.poll() is None, "the running server's stub was disturbed"
    finally:
        os.kill(running.pid, signal.SIGKILL)
        running.wait()


def test_a_port_in_use_is_named_before_anything_starts():
    import socket

    from specbatch.server.ports import PortInUseError, check_ports_free

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        check_ports_free("127.0.0.1", {"HTTP": free_port()})
        with pytest.raises(PortInUseError, match=f"the gRPC port {port} on 127.0.0.1 is in use"):
            check_ports_free("127.0.0.1", {"HTTP": free_port(), "gRPC": port})
