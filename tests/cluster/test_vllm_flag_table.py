"""Every flag a ``vllm serve`` command commonly carries, given to ``kvmesh serve``: taken with vLLM's meaning, taken as
kvmesh's flag of another name, accepted with a one-line note, or refused naming what to do instead; never
argparse's bare "unrecognized arguments" nor a did-you-mean pointing at an unrelated flag
(cluster/config/vllm_flags.py's table, docs/cli.md's from it)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import config_from_args
from kvmesh.cluster.config.trees import SERVE_SCHEMA
from kvmesh.cluster.config.vllm_flags import VLLM_SERVE_FLAGS, Mapped, NoEffect, Refused, Same
from kvmesh.cluster.config.vllm_habits import no_effect_notes

ROWS = list(VLLM_SERVE_FLAGS.items())
KVMESH_OWN = {"_StoreAction", "_StoreTrueAction", "BooleanOptionalAction", "_ExtendAction", "_AppendAction",
              "_OptionalBool"}


def argv_of(flag: str) -> list[str]:
    treatment = VLLM_SERVE_FLAGS[flag]
    along = list(treatment.along) if isinstance(treatment, Same) else []
    return ([flag] if treatment.example is None else [flag, treatment.example]) + along


def serve(argv: list[str]):
    """The parsed flags and their config, for a model given as ``vllm serve MODEL`` takes it."""
    args = build_parser().parse_args(["serve", "/models/m", *argv])
    return args, config_from_args(args, SERVE_SCHEMA, env={})


def refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", *argv])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_the_table_covers_the_flags_vllm_start_scripts_carry():
    common = {"--trust-remote-code", "--dtype", "--gpu-memory-utilization", "--max-model-len", "--tensor-parallel-size",
              "-tp", "--enforce-eager", "--enable-chunked-prefill", "--quantization", "--served-model-name",
              "--enable-auto-tool-choice", "--tool-call-parser", "--disable-log-requests", "--swap-space",
              "--max-num-seqs", "--kv-cache-dtype", "--download-dir", "--revision", "--api-key", "--host", "--port",
              "--async-scheduling", "--compilation-config", "--distributed-executor-backend", "--api-server-count"}
    assert common <= set(VLLM_SERVE_FLAGS) and len(VLLM_SERVE_FLAGS) >= 55


@pytest.mark.parametrize(("flag", "treatment"), ROWS, ids=[flag for flag, _ in ROWS])
def test_each_vllm_flag_is_taken_mapped_noted_or_refused_with_a_way(flag, treatment, capsys):
    argv = argv_of(flag)
    if isinstance(treatment, Refused):
        err = refusal(argv, capsys)
        assert f"{flag} is a vLLM flag kvmesh does not take; {treatment.instead}" in err
        assert "unrecognized arguments" not in err and "did you mean" not in err and len(err.splitlines()) == 2
        return
    args, config = serve(argv)
    notes = list(no_effect_notes(args))
    if isinstance(treatment, Same):
        parser = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
        assert type(parser._option_string_actions[flag]).__name__ in KVMESH_OWN and notes == []  # noqa: SLF001
    elif isinstance(treatment, NoEffect):
        assert notes == [f"{flag} has no effect in kvmesh: {treatment.why}"]
        assert config == serve([])[1]
    else:
        assert isinstance(treatment, Mapped)
        value = treatment.example if treatment.value is None or treatment.example is None \
            else treatment.value(treatment.example)
        assert config == serve([treatment.to] + ([] if value is None else [value]))[1]
        assert notes == ([] if treatment.spelling else
                         [f"{flag} is taken as kvmesh's {treatment.to}" + ("" if value is None else f" {value}")])
    assert capsys.readouterr().err == ""


def test_trust_remote_code_is_taken_saying_kvmesh_runs_no_remote_code():
    args, config = serve(["--trust-remote-code"])
    assert config.engine.model == "/models/m"
    assert [note for note in no_effect_notes(args)] == [
        "--trust-remote-code has no effect in kvmesh: kvmesh runs no remote code: it serves the model families it "
        "implements with its own code, whatever the model directory ships"]


@pytest.mark.parametrize(("given", "dtype"), [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")])
def test_vllms_dtype_names_are_kvmeshs(given, dtype):
    assert serve(["--dtype", given])[1].engine.dtype == dtype


@pytest.mark.parametrize(("argv", "engine"), [
    (["--enforce-eager"], {"cuda_graphs": False}), (["-tp", "2"], {"tensor_parallel_size": 2}),
    (["--kv-cache-memory-bytes", "2G"], {"kv_cache_memory": 2 << 30}),
    (["--kv-offloading-size", "0.5"], {"kv_offload_memory": 1 << 29}),
    (["--async-scheduling"], {"async_scheduling": True}), (["--no-async-scheduling"], {"async_scheduling": False}),
    (["--async-scheduling", "auto"], {"async_scheduling": None}), (["--no-cuda-graphs"], {"cuda_graphs": False}),
])
def test_mapped_and_switch_forms_set_kvmeshs_fields(argv, engine):
    config = serve(argv)[1].engine
    assert {name: getattr(config, name) for name in engine} == engine


def test_api_server_count_is_the_routers_workers():
    assert serve(["--api-server-count", "3"])[1].router.workers == 3


@pytest.mark.parametrize(("argv", "says"), [
    (["--tokenizer-mode", "mistral"], "Hugging Face tokenizer only"), (["--task", "embed"], "text generation only"),
    (["--max-logprobs", "5"], "limit is 20"), (["--distributed-executor-backend", "external_launcher"], "on Ray"),
    (["--chat-template-content-format", "openai"], "as one string"),
])
def test_a_value_asking_for_what_kvmesh_lacks_says_what_it_does(argv, says, capsys):
    err = refusal(argv, capsys)
    assert says in err and "unrecognized" not in err


@pytest.mark.parametrize("flag", ["--enable-eplb", "--worker-cls", "--max-num-partial-prefills", "--lora-dtype"])
def test_no_hint_names_a_flag_that_only_shares_words(flag, capsys):
    err = refusal([flag, "1"], capsys)
    assert "did you mean" not in err and "--help=all" in err


@pytest.mark.parametrize(("typo", "meant"), [("--max-modle-len", "--max-model-len"), ("--blok-size", "--block-size"),
                                             ("--tensor-paralel-size", "--tensor-parallel-size")])
def test_a_typo_still_gets_its_hint(typo, meant, capsys):
    assert f"{typo} (did you mean {meant}?)" in refusal([typo, "1"], capsys)


@pytest.mark.parametrize("command", ["replica", "router"])
def test_a_flag_the_command_lacks_names_the_command_that_takes_it(command, capsys):
    model = ["/models/m"] if command == "replica" else []
    flag = "--api-server-count" if command == "replica" else "--max-num-seqs"
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, *model, flag, "2"])
    err = capsys.readouterr().err
    assert f"`kvmesh {command}` does not take" in err and "`kvmesh serve` does" in err


def test_the_cli_reference_lists_every_row_with_its_treatment():
    from kvmesh.cluster.cli_reference import markdown

    table = markdown().split("## vLLM's flags")[1]
    for flag, treatment in ROWS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{flag}`"))
        assert {Same: "same", Mapped: "taken as", NoEffect: "noted", Refused: "refused"}[type(treatment)] in row, row
