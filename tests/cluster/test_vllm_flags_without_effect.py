"""``vllm serve`` flags that mean nothing for kvmesh: ``kvmesh serve``, ``replica`` and ``router`` take them, change
nothing for them and say so in one line at start-up; a value asking for what kvmesh lacks is an error naming
kvmesh's way (cluster/config/vllm_flags.py's table, applied by vllm_habits.py)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import config_from_args
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, ROUTER_SCHEMA, SERVE_SCHEMA
from kvmesh.cluster.config.vllm_habits import VLLM_NO_EFFECT_FLAGS, VLLM_ONLY_FLAGS, no_effect_notes

SCHEMAS = {"serve": SERVE_SCHEMA, "replica": REPLICA_SCHEMA, "router": ROUTER_SCHEMA}
COMMANDS = list(SCHEMAS)


def argv_of(flag: str) -> list[str]:
    """The flag as a start script would give it (with a value it means nothing with, when it takes one)."""
    no_effect = VLLM_NO_EFFECT_FLAGS[flag]
    if not no_effect.takes_value:
        return [flag]
    return [flag, no_effect.values[-1] if no_effect.values else "100"]


def error_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", list(VLLM_NO_EFFECT_FLAGS))
def test_a_flag_without_effect_is_taken_noted_and_changes_no_setting(command, flag):
    model = ["/models/m"] if command == "replica" else []
    args = build_parser().parse_args([command, *model, *argv_of(flag)])
    assert list(no_effect_notes(args)) == [f"{flag} has no effect in kvmesh: {VLLM_NO_EFFECT_FLAGS[flag].why}"]
    plain = build_parser().parse_args([command, *model])
    assert config_from_args(args, SCHEMAS[command], env={}) == config_from_args(plain, SCHEMAS[command], env={})


def test_the_issues_start_script_flags_are_all_taken_in_one_line():
    args = build_parser().parse_args(["serve", "/models/m", "--disable-log-requests", "--enable-prompt-tokens-details",
                                      "--guided-decoding-backend", "xgrammar", "--generation-config=vllm",
                                      "--max-model-len", "64"])
    assert [note.split(" ")[0] for note in no_effect_notes(args)] == [
        "--disable-log-requests", "--enable-prompt-tokens-details", "--guided-decoding-backend", "--generation-config"]
    assert config_from_args(args, SERVE_SCHEMA, env={}).engine.max_model_len == 64


def test_no_flag_means_no_note():
    assert not no_effect_notes(build_parser().parse_args(["serve"]))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("argv", "names"), [
    (["--guided-decoding-backend", "outlines"], "xgrammar only"),
    (["--guided-decoding-backend=guidance"], "xgrammar only"),
    (["--generation-config", "auto"], "no default sampling parameters from a generation config"),
    (["--generation-config", "/models/m"], "give vllm"),
    (["--uvicorn-log-level", "loud"], "not one of vLLM's levels"),
])
def test_a_value_asking_for_what_kvmesh_lacks_is_an_error_naming_its_way(command, argv, names, capsys):
    err = error_of([command, *argv], capsys)
    assert argv[0].split("=")[0] in err and names in err and "did you mean" not in err


@pytest.mark.parametrize("flag", ["--enable-log-requests", "--enable-log-outputs"])
def test_flags_that_would_log_what_kvmesh_never_logs_stay_errors(flag, capsys):
    err = error_of(["serve", flag], capsys)
    assert f"{flag} is a vLLM flag kvmesh does not take" in err and "--access-log" in err


def test_generation_config_is_taken_not_mistaken_for_print_config(capsys):
    args = build_parser().parse_args(["serve", "--generation-config", "vllm"])
    assert no_effect_notes(args) and not capsys.readouterr().err


def test_the_no_effect_and_refused_tables_do_not_overlap_and_flags_kvmesh_defines_win():
    assert not set(VLLM_NO_EFFECT_FLAGS) & set(VLLM_ONLY_FLAGS)
    commands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in COMMANDS:
        own = {flag for action in commands[command]._actions for flag in action.option_strings  # noqa: SLF001
               if type(action).__name__ not in ("_NoEffectFlag", "_RefusedFlag", "_MappedFlag")}
        assert not own & set(VLLM_NO_EFFECT_FLAGS), command


def test_the_cli_reference_lists_both_tables():
    from kvmesh.cluster.cli_reference import markdown

    text = markdown()
    assert all(f"| `{flag}`" in text for flag in [*VLLM_NO_EFFECT_FLAGS, *VLLM_ONLY_FLAGS])


def test_the_replica_command_prints_the_note_at_start_up(monkeypatch, capsys):
    from kvmesh.cluster.commands import replica

    def refuse(config, model_runner=None, **kwargs):
        raise OSError("not started by this test")

    monkeypatch.setattr(replica, "start", refuse)
    args = build_parser().parse_args(["replica", "--model", "embedded", "--port", "0", "--event-port", "0",
                                      "--replay-port", "0", "--disable-log-requests", "--uvicorn-log-level", "debug"])
    assert args.func(args) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["kvmesh replica: --disable-log-requests has no effect in kvmesh: "
                       + VLLM_NO_EFFECT_FLAGS["--disable-log-requests"].why,
                       "kvmesh replica: --uvicorn-log-level has no effect in kvmesh: "
                       + VLLM_NO_EFFECT_FLAGS["--uvicorn-log-level"].why]


def test_the_router_command_prints_the_note_at_start_up(monkeypatch, capsys):
    from kvmesh.router.control import router_server

    class NotStarted:
        def __init__(self, config, specs):
            pass

        def run(self):
            return 0

    monkeypatch.setattr(router_server, "RouterServer", NotStarted)
    args = build_parser().parse_args(["router", "--port", "0", "--workers", "1", "--disable-fastapi-docs"])
    assert args.func(args) == 0
    assert "kvmesh router: --disable-fastapi-docs has no effect in kvmesh: kvmesh serves no /docs" in \
        capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_the_reasoning_parser_flag_takes_vllms_names_and_refuses_others(command):
    from kvmesh.cluster.config.flags import ConfigError

    model = ["/models/m"] if command == "replica" else []
    for name in ("deepseek_r1", "qwen3"):
        args = build_parser().parse_args([command, *model, "--reasoning-parser", name])
        assert config_from_args(args, SCHEMAS[command], env={}).frontend.reasoning_parser == name
    args = build_parser().parse_args([command, *model, "--reasoning-parser", "granite"])
    with pytest.raises(ConfigError, match="reasoning_parser 'granite' is not known; use one of deepseek_r1, qwen3"):
        config_from_args(args, SCHEMAS[command], env={})
