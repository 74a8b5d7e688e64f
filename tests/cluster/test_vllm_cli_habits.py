"""vLLM's command-line habits: `serve MODEL` / `replica MODEL` and --lora-modules in vLLM's three forms."""

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import ConfigError, config_from_args
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, SERVE_SCHEMA


def _config(command: str, argv: list[str]):
    args = build_parser().parse_args([command, *argv])
    return config_from_args(args, SERVE_SCHEMA if command == "serve" else REPLICA_SCHEMA, env={})


@pytest.mark.parametrize("command", ["serve", "replica"])
def test_the_model_may_be_given_as_the_first_positional_argument(command):
    assert _config(command, ["/models/m", "--max-model-len", "64"]).engine.model == "/models/m"


@pytest.mark.parametrize("command", ["serve", "replica"])
def test_the_positional_model_and_an_equal_model_flag_agree(command):
    assert _config(command, ["/models/m", "--model", "/models/m"]).engine.model == "/models/m"


@pytest.mark.parametrize("command", ["serve", "replica"])
def test_a_positional_model_differing_from_the_model_flag_is_refused(command):
    with pytest.raises(ConfigError, match="/models/a.*/models/b"):
        _config(command, ["/models/a", "--model", "/models/b"])


def test_lora_modules_take_several_name_equals_path_after_one_flag():
    config = _config("replica", ["/m", "--enable-lora", "--lora-modules", "a=/p", "b=/q"])
    assert config.engine.lora_modules == {"a": "/p", "b": "/q"}


def test_lora_modules_take_vllms_json_form():
    config = _config("serve", ["--enable-lora", "--lora-modules",
                               '{"name": "a", "path": "/p", "base_model_name": "m"}', "b=/q"])
    assert config.engine.lora_modules == {"a": "/p", "b": "/q"}


@pytest.mark.parametrize("bad, message", [
    ('{"name": "a"}', "path"),
    ('{"name": "a", "path": "/p", "rank": 8}', "rank"),
    ("{not json", "JSON"),
])
def test_bad_json_lora_modules_name_what_is_wrong(bad, message):
    with pytest.raises(ConfigError, match=message):
        _config("replica", ["/m", "--enable-lora", "--lora-modules", bad])


def test_mapping_flags_still_repeat():
    config = _config("serve", ["--policy-kwargs", "temperature=0.1", "--policy-kwargs", "session_slack_s=0.5"])
    assert config.router.policy_kwargs == {"temperature": 0.1, "session_slack_s": 0.5}


@pytest.mark.parametrize("command", ["serve", "replica", "router"])
@pytest.mark.parametrize(("argv", "names"), [
    (["--data-parallel-size", "4"], "--num-replicas"), (["-dp", "2"], "--num-replicas"),
    (["--enforce-eager"], "--no-cuda-graphs"), (["--kv-events-config={}"], "--event-port"),
    (["--swap-space", "4"], "--kv-offload-memory"), (["--pipeline-parallel-size", "2"], "--tensor-parallel-size"),
])
def test_a_vllm_flag_kvmesh_does_not_take_names_the_kvmesh_way(command, argv, names, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[0].split('=')[0]} is a vLLM flag kvmesh does not take" in err and names in err
    assert "unrecognized arguments" not in err


def test_vllm_flags_that_kvmesh_takes_are_not_refused():
    config = _config("serve", ["/m", "--tensor-parallel-size", "2", "--max-num-batched-tokens", "512",
                               "--enable-prefix-caching"])
    assert config.engine.tensor_parallel_size == 2 and config.engine.max_num_batched_tokens == 512


def test_every_refused_vllm_flag_is_one_kvmesh_does_not_define():
    from kvmesh.cluster.config.vllm_forms import VLLM_ONLY_FLAGS

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in ("serve", "replica", "router"):
        refused = {flag for action in commands[command]._actions for flag in action.option_strings  # noqa: SLF001
                   if type(action).__name__ == "_VLLMOnlyFlag"}
        defined = {flag for action in commands[command]._actions for flag in action.option_strings} - refused  # noqa: SLF001
        assert refused and not set(VLLM_ONLY_FLAGS) & defined, command
