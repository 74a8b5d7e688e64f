"""vLLM's command-line habits: `serve MODEL` / `replica MODEL` and --lora-modules in vLLM's three forms."""

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import ConfigError, config_from_args
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, SERVE_SCHEMA
from kvmesh.replica.spec_decode.config import parse_speculative_config


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
    config = _config("serve", ["--policy-kwargs", "temperature=0.1", "--policy-kwargs", "session_slack_tokens=512"])
    assert config.router.policy_kwargs == {"temperature": 0.1, "session_slack_tokens": 512}


@pytest.mark.parametrize("command", ["serve", "replica", "router"])
@pytest.mark.parametrize(("argv", "names"), [
    (["--data-parallel-size", "4"], "--num-replicas"), (["-dp", "2"], "--num-replicas"),
    (["--quantization", "awq"], "--dtype"), (["--kv-events-config={}"], "--event-port"),
    (["--download-dir", "/tmp"], "HF_HUB_CACHE"), (["--pipeline-parallel-size", "2"], "--tensor-parallel-size"),
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
    from kvmesh.cluster.config.vllm_habits import VLLM_ONLY_FLAGS

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in ("serve", "replica", "router"):
        refused = {flag for action in commands[command]._actions for flag in action.option_strings  # noqa: SLF001
                   if type(action).__name__ == "_RefusedFlag"}
        defined = {flag for action in commands[command]._actions for flag in action.option_strings} - refused  # noqa: SLF001
        assert refused and not set(VLLM_ONLY_FLAGS) & defined, command


def test_served_model_name_takes_several_names_the_first_reported():
    server = _config("replica", ["/m", "--served-model-name", "first", "second", "third"]).server
    assert server.served_model_name == "first" and server.served_model_aliases == ("second", "third")
    router = _config("serve", ["/m", "--served-model-name", "first", "second", "third"]).router
    assert router.served_name == "first" and router.served_names() == ("first", "second", "third")
    one = _config("serve", ["/m", "--served-model-name", "only"]).router
    assert one.served_model_name == one.served_name == "only" and one.served_names() == ("only",)


def test_the_router_command_takes_several_served_names():
    from kvmesh.cluster.config.trees import ROUTER_SCHEMA

    args = build_parser().parse_args(["router", "--served-model-name", "a", "b"])
    router = config_from_args(args, ROUTER_SCHEMA, env={}).router
    assert (router.served_name, router.served_names()) == ("a", ("a", "b"))


def test_serve_hands_the_routers_names_to_its_replicas():
    from kvmesh.cluster.launch.replica_sections import replica_server

    cfg = _config("serve", ["/m", "--served-model-name", "a", "b"])
    server = replica_server(cfg, 0, "a", local=True, internal_key=None)
    assert (server.served_model_name, server.served_model_aliases) == ("a", ("b",))


def test_the_replicas_other_names_are_not_a_setting_of_their_own(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  served_model_aliases: [x]\n")
    with pytest.raises(ConfigError, match="served_model_aliases"):
        _config("replica", ["/m", "--config", str(config)])


@pytest.mark.parametrize("bad", [[], ["a", ""], ["a", 3]])
def test_an_empty_or_non_string_name_list_is_refused(bad):
    from kvmesh.replica.server.config import ReplicaServerConfig
    from kvmesh.router.config import RouterConfig

    with pytest.raises(ValueError, match="served_model_name: expected one or more non-empty names"):
        ReplicaServerConfig(served_model_name=bad)
    with pytest.raises(ValueError, match="served_model_name: expected one or more non-empty names"):
        RouterConfig(block_size=16, served_model_name=bad)


def test_every_served_name_is_accepted_as_the_model_and_the_first_is_reported():
    from kvmesh.replica.serving.errors import ProtocolError
    from kvmesh.replica.serving.model_names import check_model, model_aliases
    from kvmesh.router.config import RouterConfig

    router = RouterConfig(block_size=16, served_model_name=["first", "second"], model="/models/m")
    names = model_aliases(*router.served_names(), router.model)
    for model in ("first", "second", "/models/m"):
        check_model(model, router.served_name, aliases=names)
    with pytest.raises(ProtocolError, match="serves `first`"):
        check_model("third", router.served_name, aliases=names)


def test_serve_hands_every_served_name_to_its_router():
    from kvmesh.cluster.launch.launcher import ServeCluster
    from kvmesh.cluster.launch.ray_cluster import RayHandle
    from kvmesh.replica.serving.model_names import check_model, model_aliases

    cluster = ServeCluster(_config("serve", ["/m", "--served-model-name", "a", "b"]), report=lambda _: None)
    cluster.state.ray = RayHandle(owned=False, local=True, node_ip="127.0.0.1", num_gpus=0)
    cluster.state.model_path, cluster.state.served_model_name = "/m", "a"
    router = cluster.router_config()
    assert (router.served_name, router.served_names()) == ("a", ("a", "b"))
    for model in ("a", "b"):  # the router's own check (router/control/models.py) takes each name
        check_model(model, router.served_name, aliases=model_aliases(*router.served_names(), router.model))


@pytest.mark.parametrize("command", ["serve", "replica"])
def test_a_draft_models_speculative_config_is_read_in_vllms_json_form(command):
    config = _config(command, ["/m", "--speculative-config", '{"model": "/models/draft", "num_speculative_tokens": 3}'])
    spec = parse_speculative_config(config.engine.speculative_config)
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", "/models/draft", 3)


def test_a_draft_model_without_its_path_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="speculative_config.model"):
        _config("serve", ["/m", "--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 3}'])
