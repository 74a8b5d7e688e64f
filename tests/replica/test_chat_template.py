"""Chats render and tokenize exactly as transformers' ``apply_chat_template(tokenize=True)``.

``Tokenizer.render_chat`` renders with its own compiled template (replica/serving/chat_template.py) and
encodes through the router's piece cache; the reference is transformers, untouched. Real templates
(Llama-2-chat, ChatML, Llama-3-Instruct, the tests' default, and one using the environment's globals),
two real tokenizers (stories260K; a byte-level BPE with ChatML/Llama-3 special tokens), multi-turn
histories with and without a system message, special tokens and unicode inside messages, with and
without the generation prompt.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.replica.serving.chat_template import plain, render
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.tokenizer import Tokenizer
from kvmesh.router.routing.tokenize_cache import CachedTokenizer

from ..conftest import CHAT_TEMPLATE
from ..router.test_tokenize_cache import (  # noqa: F401 - fixtures
    CHATML_TEMPLATE,
    LLAMA2_TEMPLATE,
    LLAMA3_TEMPLATE,
    byte_level,
    conversation,
    stories,
)

transformers = pytest.importorskip("transformers")

# Uses what transformers' environment adds: namespace, loop controls, tojson, raise_exception, generation.
GLOBALS_TEMPLATE = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('bad role ' + m['role']) }}{% endif %}{% if m['content'] == '' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{{ bos_token }}{{ m['role'] | tojson }}:{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] | tojson }}{% endif %}"
    "{{ eos_token }}\n{% endfor %}{{ ns.n }}{% if add_generation_prompt %}assistant:{% endif %}"
)
# Laid out over lines and indented, as most shipped templates are: trim_blocks / lstrip_blocks decide its output.
MULTILINE_TEMPLATE = """{% for message in messages %}
    {% if message['role'] == 'system' %}
<<SYS>>{{ message['content'] }}<</SYS>>
    {% else %}
  [{{ message['role'] }}] {{ message['content'] | trim }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[assistant]
{% endif %}"""
TEMPLATES = [LLAMA2_TEMPLATE, CHATML_TEMPLATE, LLAMA3_TEMPLATE, CHAT_TEMPLATE, GLOBALS_TEMPLATE, MULTILINE_TEMPLATE]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _reference(hf, template: str, messages, generation_prompt: bool) -> list[int]:
    out = hf.apply_chat_template(messages, chat_template=template, add_generation_prompt=generation_prompt,
                                 tokenize=True, return_dict=False)
    return list(out)


def _check(hf, tok: Tokenizer, template: str, messages, generation_prompt: bool) -> None:
    """Every prefix of the chat (a growing history, the cache warm from the turns before) is exact."""
    for end in range(1, len(messages) + 1):
        chat = messages[:end]
        try:
            want = _reference(hf, template, chat, generation_prompt)
        except Exception as e:  # the template refuses this chat: so must we, with its words
            with pytest.raises(ProtocolError if isinstance(e, ProtocolError) else type(e), match=None):
                tok.render_chat(chat, generation_prompt, template)
            continue
        assert tok.render_chat(chat, generation_prompt, template) == want
        assert tok.apply_chat_template(chat, generation_prompt, template) == hf.apply_chat_template(
            chat, chat_template=template, add_generation_prompt=generation_prompt, tokenize=False)


def _wrap(hf) -> Tokenizer:
    return Tokenizer(hf, max_model_len=4096, cache=CachedTokenizer(hf))


@SETTINGS
@given(messages=conversation(), template=st.sampled_from(TEMPLATES), generation_prompt=st.booleans())
def test_stories_chats_tokenize_as_transformers(stories, messages, template, generation_prompt):  # noqa: F811
    _check(stories, _wrap(stories), template, messages, generation_prompt)


@SETTINGS
@given(messages=conversation(), template=st.sampled_from(TEMPLATES), generation_prompt=st.booleans())
def test_byte_level_chats_tokenize_as_transformers(byte_level, messages, template, generation_prompt):  # noqa: F811
    _check(byte_level, _wrap(byte_level), template, messages, generation_prompt)


def test_template_errors_are_the_templates_own(stories):  # noqa: F811
    tok = _wrap(stories)
    messages = [{"role": "robot", "content": "beep"}]
    with pytest.raises(Exception) as theirs:
        stories.apply_chat_template(messages, chat_template=GLOBALS_TEMPLATE, tokenize=False)
    with pytest.raises(Exception) as ours:
        tok.apply_chat_template(messages, True, GLOBALS_TEMPLATE)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value)) and "robot" in str(ours.value)


def test_sandbox_refuses_what_transformers_refuses(stories):  # noqa: F811
    import jinja2

    escape = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        stories.apply_chat_template([{"role": "user", "content": "x"}], chat_template=escape, tokenize=False)
    with pytest.raises(jinja2.exceptions.SecurityError):
        render(escape, [{"role": "user", "content": "x"}], True, {})


STR_METHODS_TEMPLATE = (
    "{% for m in messages %}{{ m['content'].strip().upper() }}|{{ m['content'].split(' ') | length }}|"
    "{{ m['role'].replace('u', 'U', 1) }}|{{ m['content'].split(' ', maxsplit=1) | length }}|{{ "
    "m['content'].startswith('a') }}|"
    "{{ '{}:{}'.format(m['role'], loop.index0) }}|{{ m['content'].title() }}\n{% endfor %}"
)


@pytest.mark.parametrize("content", [" a b ", "plain", "ünï côdé  ", ""])
def test_str_methods_in_templates_render_as_transformers(stories, content):  # noqa: F811
    """String methods are called directly (``_Sandbox.getattr``/``call``), ``format`` still through jinja2's
    sandboxed formatter, keyword arguments included: the text is transformers'."""
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": content + "x"}]
    want = stories.apply_chat_template(messages, chat_template=STR_METHODS_TEMPLATE, tokenize=False)
    assert render(STR_METHODS_TEMPLATE, messages, False, {}) == want


@pytest.mark.parametrize("template", ["{{ '{0.__class__}'.format(messages) }}",
                                      "{{ '{0.__class__}'.format_map([messages]) }}",
                                      "{% set f = 'x'.format %}{{ f.__self__.__class__ }}"])
def test_str_format_stays_sandboxed(stories, template):  # noqa: F811
    """What transformers answers (its sandbox's text or error), and no class reaches the text."""
    messages = [{"role": "user", "content": "x"}]

    def outcome(fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the outcome compared is the error's kind
            return type(e)

    theirs = outcome(lambda: stories.apply_chat_template(messages, chat_template=template, tokenize=False))
    assert outcome(lambda: render(template, messages, True, {})) == theirs
    assert not isinstance(theirs, str) or "class" not in theirs


def test_namespace_attributes_with_underscores_are_refused(stories):  # noqa: F811
    """Recent transformers refuse ``namespace(_x=...)`` (5.17 still let it through); the server refuses it
    whatever transformers is installed, and where transformers refuses too, with the same error."""
    import jinja2

    template = "{% set ns = namespace(_x=1) %}{{ ns._x }}"
    chat = [{"role": "user", "content": "x"}]
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore-prefixed attributes") as ours:
        _wrap(stories).apply_chat_template(chat, True, template)
    try:
        stories.apply_chat_template(chat, chat_template=template, tokenize=False)
    except jinja2.exceptions.SecurityError as theirs:
        assert str(theirs) == str(ours.value)


def test_messages_transformers_rewrites_are_left_to_it(stories):  # noqa: F811
    """Reasoning fields (aliased by transformers) and non-string values go through transformers itself, so
    a chat renders as the installed transformers renders it: 5.17 leaves ``reasoning_content`` alone, later
    versions alias it to ``thinking``."""
    tok = _wrap(stories)
    template = "{% for m in messages %}{{ m['thinking'] }}|{{ m['content'] }}{% endfor %}"
    messages = [{"role": "assistant", "content": "hi", "reasoning_content": "hmm"}]
    assert not plain(messages)
    theirs = stories.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert theirs in ("hmm|hi", "|hi")
    assert tok.apply_chat_template(messages, False, template) == theirs


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML_TEMPLATE])
def test_template_variables_render_as_transformers_passes_them(stories, template):  # noqa: F811
    kwargs = {"documents": [{"title": "pets", "text": "a dog"}], "reasoning_effort": "low", "enable_thinking": False}
    messages = [{"role": "user", "content": "hi"}]
    want = stories.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False,
                                       **kwargs)
    assert _wrap(stories).apply_chat_template(messages, True, template, kwargs) == want


def test_the_test_template_shows_its_variables(stories):  # noqa: F811
    tok, messages = _wrap(stories), [{"role": "user", "content": "hi"}]
    kwargs = {"documents": [{"title": "pets", "text": "a dog"}], "reasoning_effort": "low", "enable_thinking": False}
    assert tok.apply_chat_template(messages, True, CHAT_TEMPLATE, kwargs) == (
        "<s>user: hi\ndocument: a dog\nassistant: (low effort) /no_think")


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML_TEMPLATE])
def test_a_continued_final_message_renders_as_transformers_cuts_it(stories, template):  # noqa: F811
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    want = stories.apply_chat_template(messages, chat_template=template, add_generation_prompt=False, tokenize=False,
                                       continue_final_message=True)
    assert want.endswith("Once upon")
    assert _wrap(stories).apply_chat_template(messages, False, template, {"continue_final_message": True}) == want
