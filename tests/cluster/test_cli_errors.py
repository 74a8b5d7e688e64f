"""A user's mistake on the command line is one line on stderr and a non-zero exit, found before Ray or a
model loads; never a traceback. Plus --version and did-you-mean for mistyped flags."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from kvmesh.cluster.cli import main

NO_RAY = ("import sys; from kvmesh.cluster.cli import main; rc = main(sys.argv[1:]); "
          "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'imported ray/torch'; sys.exit(rc)")


def _kvmesh(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **(env or {})}
    full_env.pop("KVMESH_API_KEY", None)
    full_env.pop("KVMESH_HASH_SEED", None)
    return subprocess.run([sys.executable, "-c", NO_RAY, *argv], capture_output=True, text=True, timeout=60,
                          env=full_env)


def _one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and fragment in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("kvmesh ")


def test_mistyped_flag_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--blok-size", "32"])
    assert "--blok-size (did you mean --block-size?)" in capsys.readouterr().err


def test_serve_with_a_bad_model_path_fails_before_ray():
    _one_line_error(_kvmesh("serve", "--model", "/no/such/model"), "is not a directory")


def test_serve_with_an_unknown_hub_id_offline_fails_in_one_line():
    result = _kvmesh("serve", "--model", "no-such-org/no-such-model", env={"HF_HUB_OFFLINE": "1"})
    _one_line_error(result, "not in the local Hugging Face cache")


def test_serve_with_its_port_taken_fails_before_ray():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _kvmesh("serve", "--port", str(port), "--http-port", "0", "--event-port", "0")
    _one_line_error(result, f"router.port: port 127.0.0.1:{port} is not available")


def test_serve_refuses_the_hash_seed_on_the_command_line():
    result = _kvmesh("serve", "--hash-seed", "0123456789abcdef0123456789")
    assert result.returncode == 2 and "KVMESH_HASH_SEED" in result.stderr
    assert "0123456789abcdef0123456789" not in result.stderr


def test_events_tail_with_an_endpoint_missing_its_scheme_is_one_line():
    _one_line_error(_kvmesh("events", "tail", "--endpoint", "127.0.0.1:5557", "--duration", "0.1"),
                    "expected tcp://HOST:PORT")


def test_a_cached_hub_id_without_a_hub_is_served_offline(tmp_path):
    import os

    snapshot = tmp_path / "models--some-org--some-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--some-org--some-model" / "refs").mkdir()
    (tmp_path / "models--some-org--some-model" / "refs" / "main").write_text("abc123")
    code = ("import os; from kvmesh.cluster.config.loader import load_config; from kvmesh.cluster.launch.preflight "
            "import check; "
            "check(load_config(overrides={'engine.model': 'some-org/some-model', 'router.port': 0, "
            "'replicas.http_port': 0, 'replicas.event_port': 0}, env={})); print(os.environ.get('HF_HUB_OFFLINE'))")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_OFFLINE", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"  # the replicas load from the cache, no minutes of retries


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_prefix_of_a_flag_is_not_taken_for_it(capsys):
    err = _usage_error(["serve", "--num-replica", "3"], capsys)
    assert "--num-replica (did you mean --num-replicas?)" in err
    assert err.startswith("usage: kvmesh serve")  # the command's usage, not the top level's


def test_a_flag_before_the_command_names_the_commands_that_have_it(capsys):
    err = _usage_error(["--num-replicas", "3"], capsys)
    assert "options go after the command" in err and "`kvmesh serve --num-replicas`" in err
    assert "is no option of any command" in _usage_error(["--bogus"], capsys)


def test_a_mistyped_command_gets_a_suggestion(capsys):
    assert "did you mean 'serve'?" in _usage_error(["serv"], capsys)


def test_router_with_a_missing_model_directory_says_so_like_serve():
    result = _kvmesh("router", "--model", "../no-such-model-dir")
    _one_line_error(result, "--model '../no-such-model-dir' is not a directory")


def test_a_reader_that_left_is_an_exit_not_a_traceback():
    """`kvmesh status --json | head`: the pipe closes before kvmesh writes; every command (cli.main) exits as
    SIGPIPE would, here one whose output is a page."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte
    try:
        result = subprocess.run([sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--print-config"],
                                stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == "", result.stderr


def test_a_gpu_share_on_cpu_is_an_error_not_ignored():
    result = _kvmesh("serve", "--gpus-per-replica", "0.5", "--device", "cpu")
    _one_line_error(result, "replicas.gpus_per_replica=0.5 shares out GPUs, but the replicas run on CPU "
                            "(engine.device=cpu)")


def test_a_gpu_share_where_no_gpu_is_found_is_an_error_before_ray_starts():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = subprocess.run([sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--gpus-per-replica", "0.5",
                             "--port", "0", "--http-port", "0", "--event-port", "0"],
                            capture_output=True, text=True, timeout=120)
    _one_line_error(result, "but the replicas run on CPU (no GPU found on this machine)")


def test_router_with_a_responses_path_it_cannot_make_is_one_line():
    result = _kvmesh("router", "--port", "0", "--responses-path", "/proc/kvmesh/responses.sqlite3")
    _one_line_error(result, "cannot make /proc/kvmesh for the stored responses")


def test_router_with_a_dsn_that_is_not_postgresqls_is_one_line():
    result = _kvmesh("router", "--port", "0", env={"KVMESH_ROUTER_RESPONSES_DSN": "mysql://db/kv"})
    _one_line_error(result, "responses.dsn must be a PostgreSQL connection string")
