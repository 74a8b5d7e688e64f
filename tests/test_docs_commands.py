"""Every command of the user guides works: every block is marked, the blocks marked ``run`` run
here, and every ``kvmesh`` command line of any block is parsed by the real argument parser
(tests/docs_commands.py has the markers and what each kind gets; test_docs_commands_live.py runs the ``live``
blocks against a ``kvmesh serve``, test_docs_commands_server.py the ``server`` blocks with their servers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import SHARED_DIR
from .docs_commands import (
    KINDS,
    blocks,
    command_environment,
    install_problem,
    kvmesh_argvs,
    parse_kvmesh,
    python_imports_resolve,
    repo_paths_missing,
    run_command,
    scratch_layout,
    shell_commands,
    words,
)

BIN = Path(sys.executable).parent
RUN_CPU_S = 90
"""CPU seconds a guide's command may use (per process): a budget a loaded machine does not shorten."""
RUN_BACKSTOP_S = 1200
"""Wall-clock seconds before a command counts as hung (the machine may be shared with other CPU-bound work)."""
SIM_LIMIT = {"KVMESH_WORKLOAD_LIMIT": "1000"}
"""A ``kvmesh sim`` replays the first 1000 requests of its workload, the quick cut its guide names (the whole Mooncake
trace is 3993: the same code paths, a quarter of the CPU)."""

BLOCKS = blocks()


def _commands(*kinds: str) -> list:
    return [pytest.param(block, command, id=f"{block.where}:{command[:60]}")
            for block in BLOCKS if block.kind in kinds and block.language != "python"
            for command in block.commands()]


def test_every_command_block_of_the_guides_is_marked():
    errors = [block.error for block in BLOCKS if block.error]
    assert not errors, "\n".join(errors)
    assert {block.path for block in BLOCKS} >= {"README.md", "deploy/README.md"}


def test_an_unmarked_block_is_an_error_naming_its_file_and_line(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text("# Guide\n\n```bash\nkvmesh status\n```\n\n<!-- docs-test: gpu -->\n```\nkvmesh serve\n```\n"
                     "\n<!-- docs-test: gpu (two GPUs) -->\n```sh\nkvmesh serve\n```\n\n```text\nnot commands\n```\n")
    found = blocks([guide])
    assert [(b.line, b.kind) for b in found] == [(3, None), (8, "gpu"), (13, "gpu")]
    assert found[0].error.startswith(f"{guide}:3: a ```bash block without a marker")
    assert "needs a reason" in found[1].error and not found[2].error


def test_every_shell_block_has_a_command():
    empty = [block.where for block in BLOCKS if block.language != "python" and not block.commands()]
    assert not empty, f"shell blocks without a command (a printout or a diagram is ```text): {empty}"


def test_shell_commands_join_continuations_and_open_quotes():
    text = "# a comment\nkvmesh sim \\\n  --num-replicas 2   # why\ncurl -d '{\"a\": 1,\n \"b\": 2}'\n\n$ not\n"
    assert shell_commands(text) == ["kvmesh sim   --num-replicas 2   # why", "curl -d '{\"a\": 1,\n \"b\": 2}'",
                                    "$ not"]
    assert shell_commands("$ kvmesh status\nkvmesh: output\n", console=True) == ["kvmesh status"]
    assert kvmesh_argvs('ray exec deploy/aws.yaml "A=b kvmesh status --json"') == [["status", "--json"]]
    assert kvmesh_argvs("KVMESH_ADMIN_KEY=x kvmesh drain r") == [["drain", "r"]]


def test_a_wrong_flag_fails_the_parse():
    assert parse_kvmesh(["serve", "--num-replica", "2"]) is not None
    assert parse_kvmesh(["bench", "load", "--urll", "x"]) is not None
    assert parse_kvmesh(["serve", "--num-replicas", "2"]) is None


@pytest.mark.parametrize("block, command", _commands(*KINDS))
def test_every_kvmesh_command_line_parses(block, command):
    for argv in kvmesh_argvs(command):
        problem = parse_kvmesh(argv)
        assert problem is None, f"{block.where}: `kvmesh {' '.join(argv)}`: {problem}"


@pytest.mark.parametrize("block, command", _commands(*KINDS))
def test_repository_files_named_by_commands_exist(block, command):
    assert not repo_paths_missing(command), f"{block.where}: {command}"


@pytest.mark.parametrize("block, command", _commands("install"))
def test_install_commands_name_real_targets_and_extras(block, command):
    assert words(command)[0] in ("make", "pip", "python"), f"{block.where}: not an install command: {command}"
    assert install_problem(command) is None, f"{block.where}: {command}: {install_problem(command)}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "python"], ids=lambda b: b.where)
def test_python_blocks_compile_and_their_kvmesh_imports_exist(block):
    compile(block.text, block.where, "exec")
    assert not python_imports_resolve(block.text), block.where


# -- run: in a subprocess, from a scratch copy of the checkout's layout ------------------------------------

@pytest.fixture(scope="module")
def scratch_checkout(tmp_path_factory) -> Path:
    """A folder laid out as the checkout (its entries linked, ``results/`` empty, so that a command's output
    leaves the real one alone) with ``../shared`` beside it; skips without ../shared."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"the guides' commands read ../shared, not found at {SHARED_DIR}")
    return scratch_layout(tmp_path_factory.mktemp("docs"), SHARED_DIR)


def _run_in(scratch: Path, block, command: str, cpu_limit_s: float) -> None:
    sim = any(argv[:1] == ["sim"] for argv in kvmesh_argvs(command))
    env = command_environment(BIN, KVMESH_RESULTS_DIR=str(scratch / "results"),
                              KVMESH_CACHE_DIR=str(scratch.parent / "cache"), **(SIM_LIMIT if sim else {}))
    run_command(command, block.where, scratch, env, RUN_BACKSTOP_S, private_tmp=True, cpu_limit_s=cpu_limit_s)


def test_the_sim_cut_the_commands_run_with_is_the_one_their_guide_names():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks-and-simulator.md").read_text()
    name, value = next(iter(SIM_LIMIT.items()))
    assert f"`{name}=N`" in guide and f"with {value})" in guide


@pytest.mark.timeout(RUN_BACKSTOP_S + 60)
@pytest.mark.parametrize("block, command", _commands("run"))
def test_run_commands(block, command, scratch_checkout):
    _run_in(scratch_checkout, block, command, RUN_CPU_S)

