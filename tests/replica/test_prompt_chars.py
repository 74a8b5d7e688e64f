"""``max_prompt_chars`` bounds every text a chat's messages carry into the template, tool calls included: a chat of
100,000 assistant tool calls (or one call with megabytes of arguments) is a 400 before any rendering, as the same
text in ``content`` is."""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.tokenizer import load_tokenizer

from ..conftest import CHAT_TEMPLATE

LIMIT = 4096


@pytest.fixture()
def renderer(stories_path):
    tokenizer = load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)
    r = PromptRenderer(tokenizer, FrontendConfig(max_prompt_chars=LIMIT))
    yield r
    r.close()


def _call(arguments: str, name: str = "f") -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("calls", [[_call("x" * (LIMIT + 1))], [_call("{}")] * LIMIT, [_call("{}", "n" * LIMIT)]],
                         ids=["huge arguments", "many calls", "a huge name"])
def test_tool_calls_count_toward_the_prompts_characters(renderer, calls):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    with pytest.raises(ProtocolError) as e:
        asyncio.run(renderer.chat(messages))
    assert e.value.status_code == 400 and e.value.param == "messages" and "characters" in e.value.message


def test_a_few_calls_render(renderer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [_call("{}")]}]
    assert asyncio.run(renderer.chat(messages))
