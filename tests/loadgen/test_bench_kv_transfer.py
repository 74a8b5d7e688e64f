"""``kvmesh bench kv-transfer``: block reads between two processes over NIXL, written to a file."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.cli import main
from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

FLASH_LAYOUT = "L,2,blocks,B,H,D"


@pytest.mark.skipif(nixl_missing() is not None, reason=str(nixl_missing()))
def test_bench_writes_reads_per_block_count_and_pattern_with_a_plot(tmp_path):
    out = tmp_path / "kv_transfer.json"
    assert main(["bench", "kv-transfer", "--blocks", "1", "4", "--repeat", "2", "--layouts", FLASH_LAYOUT,
                 "--out", str(out)]) == 0
    (run,) = json.loads(out.read_text())["layouts"]
    assert run["kv_layout"] == FLASH_LAYOUT and run["bytes_per_block"] == 16 * 2 * 16 * 8 * 64 * 2
    assert [(r["blocks"], r["contiguous"]) for r in run["reads"]] == [(1, False), (4, False), (1, True), (4, True)]
    assert all(r["gb_per_s"] > 0 and r["bytes"] == r["blocks"] * run["bytes_per_block"] for r in run["reads"])
    assert run["per_request_overhead_s"] == run["reads"][0]["wall_median_s"]
    assert out.with_suffix(".png").stat().st_size > 0


def test_an_unknown_layout_is_refused_naming_the_known_ones(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "kv-transfer", "--layouts", "L,blocks"])
    assert e.value.code == 2
    assert "unknown layouts ['L,blocks']" in capsys.readouterr().err
