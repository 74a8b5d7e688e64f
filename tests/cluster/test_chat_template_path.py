"""``--chat-template`` takes a template or a path to one (vLLM's rule): a value without Jinja's braces or a newline
is a path, and one that names no readable file is refused at start with what was wrong, for the replica, the router
and ``kvmesh serve`` alike (never taken as the template's own text)."""

from __future__ import annotations

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.flags import ConfigError, config_from_args
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, ROUTER_SCHEMA, SERVE_SCHEMA
from kvmesh.replica.openai.config import FrontendConfig

SCHEMAS = {"serve": SERVE_SCHEMA, "replica": REPLICA_SCHEMA, "router": ROUTER_SCHEMA}
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def frontend(command: str, value: str) -> FrontendConfig:
    model = ["/models/m"] if command == "replica" else []
    args = build_parser().parse_args([command, *model, "--chat-template", value])
    return config_from_args(args, SCHEMAS[command], env={}).frontend


@pytest.mark.parametrize("command", list(SCHEMAS))
@pytest.mark.parametrize("value", ["../shared/does-not-exist.jinja", "does-not-exist.jinja", "templates/chat",
                                   "chatml"])
def test_a_path_that_names_no_file_is_refused_at_start(command, value):
    with pytest.raises(ConfigError, match=f"chat_template {value!r} looks like a file path.*no such file"):
        frontend(command, value)


@pytest.mark.parametrize("command", list(SCHEMAS))
def test_a_directory_is_not_a_template_file(command, tmp_path):
    with pytest.raises(ConfigError, match="is a directory, not a template file"):
        frontend(command, str(tmp_path))


@pytest.mark.parametrize("command", list(SCHEMAS))
def test_an_existing_file_and_template_text_are_taken(command, tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    assert frontend(command, str(path)).chat_template == str(path)
    assert frontend(command, TEMPLATE).chat_template == TEMPLATE
    assert frontend(command, "Hello\nworld").chat_template == "Hello\nworld"  # a newline: text, as vLLM reads it


def test_the_frontend_config_refuses_it_where_it_is_built_directly():
    with pytest.raises(ValueError, match="looks like a file path"):
        FrontendConfig(chat_template="/nowhere/chat.jinja")
    assert FrontendConfig(chat_template=None).chat_template is None
