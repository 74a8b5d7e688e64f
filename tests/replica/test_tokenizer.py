"""The shared tokenizer: torch-free, same ids as transformers' AutoTokenizer, vLLM's special-token rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.tokenizer import NO_CHAT_TEMPLATE, load_tokenizer

from ..conftest import CHAT_TEMPLATE, REPO_ROOT

KVMESH_PACKAGES = ("kvcache", "events", "replica", "router", "cluster")

ONCE = "Once upon a time"


@pytest.fixture(scope="module")
def tok(stories_path):
    return load_tokenizer(stories_path, chat_template=CHAT_TEMPLATE)


# Records which file first imports torch (the innermost frame outside the import machinery), then lets it.
FIRST_TORCH_IMPORTER = """
import sys, traceback
class Spy:
    importer = None
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Spy.importer is None:
            frames = [f.filename for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<")]
            Spy.importer = frames[-1]
        return None
sys.meta_path.insert(0, Spy())
"""


def test_loading_and_rendering_never_imports_torch(stories_path):
    """kvmesh's tokenizer path imports no torch (the router installs without it). transformers itself may
    where torch is installed (5.17's tokenizers backend imports its GGUF loader, which imports torch), and
    where it does not, nothing does."""
    code = FIRST_TORCH_IMPORTER + (
        "from kvmesh.replica.serving.tokenizer import load_tokenizer\n"
        "from kvmesh.replica.openai import protocol\n"
        f"t = load_tokenizer({str(stories_path)!r}, chat_template={CHAT_TEMPLATE!r})\n"
        f"assert t.render_completion({ONCE!r}) == [1, 403, 407, 261, 378]\n"
        "t.render_chat([{'role': 'user', 'content': 'hi'}])\n"
        "print(Spy.importer or '')\n"
    )
    importer = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True,
                              text=True).stdout.strip()
    if importer:
        assert f"{os.sep}transformers{os.sep}" in importer, f"torch imported by {importer}"
        assert not any(Path(importer).is_relative_to(REPO_ROOT / d) for d in KVMESH_PACKAGES), importer


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


def test_model_without_template_refuses_chat_like_vllm(stories_path):
    bare = load_tokenizer(stories_path)
    assert bare.chat_template is None
    assert bare.render_completion(ONCE) == [1, 403, 407, 261, 378]  # completions still work
    with pytest.raises(ProtocolError) as e:
        bare.render_chat([{"role": "user", "content": "hi"}])
    assert e.value.status_code == 400 and e.value.message == NO_CHAT_TEMPLATE


def test_configured_template_renders_roles(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s>user: hi\nassistant:"
    no_gen = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert not no_gen.endswith("assistant:")


@pytest.mark.parametrize("ids", [[5, -1], [5, 2**32], [5, 10**30]])
def test_token_ids_outside_the_vocabulary_are_refused(tok, ids):
    with pytest.raises(ProtocolError) as e:
        tok.render_completion(ids)
    assert e.value.status_code == 400 and "out of range" in e.value.message


def test_custom_template_is_used(stories_path):
    t = load_tokenizer(stories_path, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert t.render_chat([{"role": "user", "content": ONCE}]) == t.encode(ONCE, add_special_tokens=False)


def test_max_model_len_from_config_or_override(stories_path):
    assert load_tokenizer(stories_path).max_model_len == 512
    assert load_tokenizer(stories_path, max_model_len=128).max_model_len == 128
