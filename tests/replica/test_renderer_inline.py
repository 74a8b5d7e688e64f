"""What the renderer does on the event loop and what it sends to its threads (cheap work inline).

Cheap work stays on the loop (a thread hop costs more than it); big or unknown work never runs there:
text whose pieces the tokenizer has cached is tokenized inline however long, text with more than
``_INLINE_CHARS`` new characters goes to the pool, and so does anything over ``_INLINE_MAX_CHARS``.
"""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.replica.openai import renderer as rmod
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.routing.tokenize_cache import CachedTokenizer

from ..conftest import CHAT_TEMPLATE

STORY = "Once upon a time there was a little girl who loved to play in the park with her dog. "


@pytest.fixture()
def renderer(stories_path):
    tok = load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)
    tok.cache = CachedTokenizer(tok.hf)
    r = PromptRenderer(tok, FrontendConfig())
    r.hops = 0
    run = r.run

    async def counted(fn, *args):
        r.hops += 1
        return await run(fn, *args)

    r.run = counted
    yield r
    r.close()


def test_long_prompt_seen_before_is_tokenized_on_the_loop(renderer):
    prompt = STORY * 60  # ~5,000 characters: over _INLINE_CHARS
    assert len(prompt) > rmod._INLINE_CHARS
    first = asyncio.run(renderer.completion(prompt))
    assert renderer.hops == 1  # new text: the pool
    again = asyncio.run(renderer.completion(prompt + "The end."))
    assert renderer.hops == 1  # only "The end." was new: inline
    assert first == renderer.tokenizer.hf.encode(prompt) and again == renderer.tokenizer.hf.encode(prompt + "The end.")


def test_chat_with_a_history_seen_before_is_rendered_on_the_loop(renderer):
    history = [{"role": "system", "content": STORY * 30}, {"role": "user", "content": STORY * 10}]
    asyncio.run(renderer.chat(history))
    assert renderer.hops == 1
    history += [{"role": "assistant", "content": "She ran."}, {"role": "user", "content": "And then?"}]
    ids = asyncio.run(renderer.chat(history))
    assert renderer.hops == 1
    assert ids == renderer.tokenizer.hf.apply_chat_template(history, chat_template=CHAT_TEMPLATE,
                                                            add_generation_prompt=True, tokenize=True,
                                                            return_dict=False)


def test_huge_text_goes_to_the_pool_even_when_cached(renderer):
    prompt = STORY * (rmod._INLINE_MAX_CHARS // len(STORY) + 1)
    asyncio.run(renderer.completion(prompt))
    asyncio.run(renderer.completion(prompt))
    assert renderer.hops == 2


def test_without_a_cache_long_text_goes_to_the_pool(renderer):
    renderer.tokenizer.cache = None
    prompt = STORY * 60
    asyncio.run(renderer.completion(prompt))
    asyncio.run(renderer.completion(prompt))
    asyncio.run(renderer.completion(STORY))  # short: inline
    assert renderer.hops == 2
