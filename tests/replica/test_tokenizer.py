"""The shared tokenizer: torch-free, same ids as transformers' AutoTokenizer, vLLM's special-token rules."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kvmesh.replica.tokenizer import DEFAULT_CHAT_TEMPLATE, load_tokenizer

ONCE = "Once upon a time"


@pytest.fixture(scope="module")
def tok(stories_path):
    return load_tokenizer(stories_path)


def test_loading_and_rendering_never_imports_torch(stories_path):
    code = (
        "import sys\n"
        "from kvmesh.replica.tokenizer import load_tokenizer\n"
        "from kvmesh.replica import protocol\n"
        f"t = load_tokenizer({str(stories_path)!r})\n"
        f"assert t.render_completion({ONCE!r}) == [1, 403, 407, 261, 378]\n"
        "t.render_chat([{'role': 'user', 'content': 'hi'}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_completion_ids_equal_autotokenizer(tok, stories_path):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(stories_path))
    assert tok.render_completion(ONCE) == [1, 403, 407, 261, 378]
    for text in [ONCE, "Lily and Tom went to the park. They saw a big dog!", " leading space", "a\nb"]:
        assert tok.render_completion(text) == ref(text).input_ids


def test_completion_token_ids_pass_through_unchanged(tok):
    assert tok.render_completion([5, 6, 7]) == [5, 6, 7]


def test_chat_adds_bos_once_via_template(tok):
    ids = tok.render_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tok.bos_token_id
    assert ids.count(tok.bos_token_id) == 1


def test_default_template_when_model_has_none(tok):
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s>user: hi\nassistant:"
    no_gen = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert not no_gen.endswith("assistant:")


def test_custom_template_is_used(stories_path):
    t = load_tokenizer(stories_path, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert t.render_chat([{"role": "user", "content": ONCE}]) == t.encode(ONCE, add_special_tokens=False)


def test_max_model_len_from_config_or_override(stories_path):
    assert load_tokenizer(stories_path).max_model_len == 512
    assert load_tokenizer(stories_path, max_model_len=128).max_model_len == 128
