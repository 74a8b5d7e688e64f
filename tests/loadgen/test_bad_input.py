"""Bad input fails fast with a message that says what and where."""

from __future__ import annotations

import socket
import time

import pytest
from kvmesh.cluster.measure.loadgen.load import main
from kvmesh.cluster.measure.workloads.traces import TraceError, read_azure, read_mooncake


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_malformed_mooncake_line_reports_its_line_number(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                    "\n"
                    '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1\n')
    with pytest.raises(TraceError, match=r"trace\.jsonl:3: not valid JSON") as e:
        read_mooncake(path)
    assert e.value.line == 3


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "missing field 'input_length'"),
    ('{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}', "needs at least 4 hash_ids"),
    ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "'timestamp'"),
    ('[1, 2]', "expected a JSON object"),
])
def test_invalid_mooncake_fields_are_named(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [7]}\n' + line + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: .*" + message.replace("(", r"\(")):
        read_mooncake(path)


def test_malformed_azure_row_reports_its_line_number(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:47.0000000,lots,44\n")
    with pytest.raises(TraceError, match=r"azure\.csv:3: "):
        read_azure(path)


def test_azure_reader_parses_real_timestamps(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.5000000,374,44\n2023-11-16 18:15:48.0000000,10,2\n")
    recs = read_azure(path)
    assert [r.arrival_s for r in recs] == [0.0, 1.5] and recs[0].context_tokens == 374


def test_cli_checks_the_endpoint_before_reading_the_trace(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    # the endpoint is checked first, so point at a port nobody listens on... and expect the endpoint error
    rc = main(["--url", f"http://127.0.0.1:{_free_port()}", "--workload", "mooncake", "--trace", str(path),
               "--no-progress", "--no-plot"])
    assert rc == 2


def test_cli_reports_bad_trace_line_against_a_live_server(fake_server, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [7]}\nnot json\n')
    rc = main(["--url", fake_server.url, "--workload", "mooncake", "--trace", str(path), "--no-progress",
               "--no-plot", "--out", str(tmp_path / "o.json")])
    assert rc == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_unreachable_endpoint_fails_fast_with_a_clear_message(tmp_path, capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    t0 = time.perf_counter()
    rc = main(["--url", url, "--num-requests", "3", "--no-progress", "--out", str(tmp_path / "o.json")])
    assert rc == 2 and time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert f"cannot connect to {url}" in err and "kvmesh serve" in err
    assert not (tmp_path / "o.json").exists()


def test_chat_with_token_prompts_is_refused(fake_server, capsys):
    rc = main(["--url", fake_server.url, "--api", "chat", "--no-progress", "--no-plot"])
    assert rc == 2 and "--prompt-format text" in capsys.readouterr().err
