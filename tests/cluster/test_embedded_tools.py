"""The embedded model (the README's quick start) serves ``tool_choice: "auto"`` with the hermes parser, so an agent
loop, which leaves tool_choice to the server after its first call, works against ``make serve`` as written; a model
the user names keeps vLLM's rule (the flags turn it on)."""

from __future__ import annotations

from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import config_from_args
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, SERVE_SCHEMA
from kvmesh.cluster.launch.embedded_model import served_frontend


def serve_config(*argv: str):
    return config_from_args(build_parser().parse_args(["serve", *argv]), SERVE_SCHEMA, env={})


def test_the_embedded_model_serves_auto_tool_choice_with_hermes():
    frontend = served_frontend(serve_config().frontend, serve_config().engine.model)
    assert (frontend.enable_auto_tool_choice, frontend.tool_call_parser) == (True, "hermes")


def test_a_named_model_keeps_vllms_rule():
    config = serve_config("/models/m")
    frontend = served_frontend(config.frontend, config.engine.model)
    assert (frontend.enable_auto_tool_choice, frontend.tool_call_parser) == (False, None)


def test_a_parser_the_user_names_is_kept():
    config = serve_config("--enable-auto-tool-choice", "--tool-call-parser", "llama3_json")
    assert served_frontend(config.frontend, config.engine.model).tool_call_parser == "llama3_json"


def test_serve_hands_the_router_and_replicas_the_embedded_frontend():
    from kvmesh.cluster.launch.launcher import ServeCluster
    from kvmesh.cluster.launch.ray_cluster import RayHandle

    cluster = ServeCluster(serve_config(), report=lambda _: None)
    cluster.state.ray = RayHandle(owned=False, local=True, node_ip="127.0.0.1", num_gpus=0)
    cluster.state.model_path, cluster.state.served_model_name = "/m", "kvmesh-embedded"
    assert cluster.router_config().frontend.enable_auto_tool_choice


def test_the_replica_command_serves_the_embedded_model_so_too():
    from kvmesh.cluster.commands.replica import embedded

    config = config_from_args(build_parser().parse_args(["replica", "--model", "embedded"]), REPLICA_SCHEMA, env={})
    assert embedded(config).frontend.tool_call_parser == "hermes"


def test_a_chat_with_tools_and_no_tool_choice_passes_the_check():
    from kvmesh.replica.openai.protocol import ChatCompletionRequest

    frontend = served_frontend(serve_config().frontend, serve_config().engine.model)
    request = ChatCompletionRequest.model_validate({
        "model": "kvmesh-embedded", "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})
    request.check_tool_choice_served(frontend.enable_auto_tool_choice, frontend.tool_call_parser)
