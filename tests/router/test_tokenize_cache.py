"""CachedTokenizer gives exactly the plain tokenizer's ids, over real chat templates and real tokenizers.

Tokenizers: stories260K (SentencePiece-style BPE, Metaspace prepend_scheme="first", BOS added by
the post-processor) and a byte-level BPE trained here with ChatML and Llama-3 special tokens
(the GPT-2/Llama-3 pre-tokenizer). Templates: Llama-2-chat, ChatML (Qwen2) and Llama-3-Instruct,
as their models ship them. The reference is the tokenizer itself, through transformers.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.cluster.measure.benchmarks.router_peers import LLAMA2_CHAT_TEMPLATE
from kvmesh.router.routing.tokenize_cache import CachedTokenizer

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

LLAMA2_TEMPLATE = LLAMA2_CHAT_TEMPLATE  # the benchmark's workload template: one definition
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>"]
CORPUS = ["Once upon a time there was a little girl who loved the sun.", "def add(a, b):\n    return a + b\n",
          "The quick brown fox jumps over the lazy dog 1234567890 times!", "Ünïcödé — テキスト, emoji 🙂 and\ttabs"]


@pytest.fixture(scope="module")
def stories(stories_path):
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(stories_path))


@pytest.fixture(scope="module")
def byte_level():
    """A Llama-3-style byte-level BPE with ChatML and Llama-3 special tokens; BOS added like Llama-3."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[
        ("<|begin_of_text|>", bos)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token="<|eot_id|>")


# Message text: words, whitespace runs, unicode, and pieces (or all) of the special tokens.
fragment = st.sampled_from(["Hello", " world", "\n", "\n\n", "  ", "\t", "Once upon", " a time", "sun.", "🙂", "テ",
                            "<s>", "</s>", "<|im_end|>", "<|im_", "start|>", "<|eot_id|>", "[INST]", "<<SYS>>",
                            "123", "'s", "’", "▁", " ", "lazy dog"])
content = st.lists(st.one_of(fragment, st.text(max_size=6)), max_size=8).map("".join)


@st.composite
def conversation(draw):
    turns = draw(st.lists(content, min_size=1, max_size=7))
    messages = [{"role": "system", "content": draw(content)}] if draw(st.booleans()) else []
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(turns)]
    return messages


def _render(hf, template: str, messages, generation_prompt: bool) -> str:
    return hf.apply_chat_template(messages, chat_template=template, add_generation_prompt=generation_prompt,
                                  tokenize=False)


def _check_history(hf, cached: CachedTokenizer, template: str, messages) -> None:
    """Every prefix of the chat (a growing history, cache warm from the turns before) encodes exactly."""
    for end in range(1, len(messages) + 1):
        text = _render(hf, template, messages[:end], generation_prompt=True)
        assert cached.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        assert cached.encode(text, add_special_tokens=True) == hf.encode(text, add_special_tokens=True)


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(messages=conversation(), template=st.sampled_from([LLAMA2_TEMPLATE, None]))
def test_stories_chat_encodes_exactly(stories, messages, template):
    from ..conftest import CHAT_TEMPLATE

    _check_history(stories, CachedTokenizer(stories), template or CHAT_TEMPLATE, messages)


@SETTINGS
@given(messages=conversation(), template=st.sampled_from([CHATML_TEMPLATE, LLAMA3_TEMPLATE]))
def test_byte_level_chat_encodes_exactly(byte_level, messages, template):
    _check_history(byte_level, CachedTokenizer(byte_level), template, messages)


@SETTINGS
@given(texts=st.lists(content, min_size=1, max_size=6), add=st.booleans())
def test_shared_cache_stays_exact_across_unrelated_requests(stories, byte_level, texts, add):
    for hf in (stories, byte_level):
        cached = CachedTokenizer(hf, max_cached_tokens=40)  # small: evictions happen along the way
        for text in texts + texts[::-1]:
            assert cached.encode(text, add) == hf.encode(text, add_special_tokens=add)
        assert cached.cached_tokens <= 40


def test_first_piece_is_keyed_apart_from_the_same_text_after_a_special_token(stories):
    cached = CachedTokenizer(stories)
    for text in ["Hello there", "<s>Hello there", "Hello there</s>Hello there"]:
        assert cached.encode(text, False) == stories.encode(text, add_special_tokens=False)
    assert cached.encode("Hello there", False) != cached.encode("<s>Hello there", False)[1:]


def test_repeated_history_comes_from_the_cache(byte_level):
    cached = CachedTokenizer(byte_level)
    history = [{"role": "system", "content": "You are a storyteller. " * 20},
               {"role": "user", "content": "Tell me about the sun."}]
    cached.encode(_render(byte_level, CHATML_TEMPLATE, history, True), False)
    tokenized = cached.miss_tokens
    history += [{"role": "assistant", "content": "The sun is warm."}, {"role": "user", "content": "More!"}]
    text = _render(byte_level, CHATML_TEMPLATE, history, True)
    assert cached.encode(text, False) == byte_level.encode(text, add_special_tokens=False)
    assert cached.hit_tokens > 2 * (cached.miss_tokens - tokenized)  # the old turns were not tokenized again


def test_tokens_that_strip_neighbouring_spaces_are_encoded_plainly(byte_level):
    from tokenizers import AddedToken

    backend = tokenizers.Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    backend.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    cached = CachedTokenizer(backend)
    for text in ["a <mask> b", "<|im_start|>x <mask>\n<|im_end|>", "<|im_start|>no mask<|im_end|>"]:
        assert cached.encode(text, False) == backend.encode(text, add_special_tokens=False).ids
    assert cached.hit_tokens == 0 and cached.cached_pieces == 1  # only "no mask" was cut out and cached


def test_truncating_tokenizer_is_never_cached(byte_level):
    backend = tokenizers.Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    backend.enable_truncation(8)
    cached = CachedTokenizer(backend)
    text = "<|im_start|>Once upon a time there was a little girl<|im_end|>" * 3
    assert cached.encode(text) == backend.encode(text).ids
    assert cached.uncached_reason is not None and cached.cached_pieces == 0


def test_negative_cache_bound_is_a_clear_error(stories):
    with pytest.raises(ValueError, match="max_cached_tokens"):
        CachedTokenizer(stories, max_cached_tokens=-1)


@SETTINGS
@given(texts=st.lists(st.lists(st.one_of(fragment, st.text(max_size=12)), max_size=30).map("".join), min_size=1,
                      max_size=5), chunk=st.integers(1, 24), add=st.booleans())
def test_long_prompts_cut_at_spaces_encode_exactly(stories, texts, chunk, add):
    cached = CachedTokenizer(stories, chunk_chars=chunk)
    assert cached.cuts_at_spaces  # SentencePiece-style BPE: no token holds "▁" past its start
    shared = texts[0]
    for text in texts + [shared + t for t in texts]:  # later prompts share a prefix with earlier ones
        assert cached.encode(text, add) == stories.encode(text, add_special_tokens=add)


def test_shared_prompt_prefix_is_tokenized_once(stories):
    cached = CachedTokenizer(stories, chunk_chars=64)
    prefix = "Once upon a time there was a little girl who loved to play in the park with her dog. " * 12
    cached.encode(prefix + "She found a ball.")
    tokenized = cached.miss_tokens
    text = prefix + "Then she ran home to tell her mom."
    assert cached.encode(text) == stories.encode(text)
    assert cached.miss_tokens - tokenized < 40  # only the chunks after the shared prefix


def _with_pre_tokenizer(hf, pre_tokenizer: dict):
    spec = json.loads(hf.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = pre_tokenizer
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def gpt2_style(byte_level):
    """The same BPE behind GPT-2's pre-tokenizer (ByteLevel with its built-in regex)."""
    return _with_pre_tokenizer(byte_level, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                            "use_regex": True})


@SETTINGS
@given(texts=st.lists(st.lists(st.one_of(fragment, st.text(max_size=12)), max_size=30).map("".join), min_size=1,
                      max_size=5), chunk=st.integers(1, 24), add=st.booleans())
def test_byte_level_long_prompts_cut_at_spaces_encode_exactly(byte_level, gpt2_style, texts, chunk, add):
    for tok in (byte_level.backend_tokenizer, gpt2_style):
        cached = CachedTokenizer(tok, chunk_chars=chunk)
        assert cached.cuts_at_spaces  # Llama-3's split regex / GPT-2's built-in one
        for text in texts + [texts[0] + t for t in texts]:
            assert cached.encode(text, add) == tok.encode(text, add_special_tokens=add).ids


def test_unknown_split_regex_is_never_cut_at_spaces(byte_level):
    pre = json.loads(byte_level.backend_tokenizer.to_str())["pre_tokenizer"]
    pre["pretokenizers"][0]["pattern"]["Regex"] = r"\S+\s*"  # a space-eating regex: cutting would be wrong
    tok = _with_pre_tokenizer(byte_level, pre)
    cached = CachedTokenizer(tok, chunk_chars=4)
    assert not cached.cuts_at_spaces
    text = "<|im_start|>Once upon a time there was a little girl<|im_end|>"
    assert cached.encode(text) == tok.encode(text).ids


def test_piece_after_a_token_is_not_glued_into_a_longer_added_token(byte_level):
    from tokenizers import AddedToken

    backend = tokenizers.Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    # "<|begin_of_text|>" (the first added token) now starts a longer one: it must not lead pieces
    backend.add_special_tokens([AddedToken("<|begin_of_text|>Once", normalized=False)])
    cached = CachedTokenizer(backend)
    for text in ["<|im_start|>Once upon a time<|im_end|>", "<|begin_of_text|>Once upon<|eot_id|>Once more"]:
        assert cached.encode(text, False) == backend.encode(text, add_special_tokens=False).ids


@SETTINGS
@given(texts=st.lists(st.lists(st.one_of(fragment, st.text(max_size=12)), max_size=30).map("".join), min_size=1,
                      max_size=5), budget=st.integers(0, 40), add=st.booleans())
def test_encode_within_a_budget_is_exact_or_declines(stories, texts, budget, add):
    cached = CachedTokenizer(stories, chunk_chars=8)
    for text in texts + [texts[0] + t for t in texts]:
        ids = cached.encode(text, add, max_fresh_chars=budget)
        if ids is None:  # declined: more than the budget was new; nothing was cached
            assert cached.encode(text, add, max_fresh_chars=len(text)) == stories.encode(text, add_special_tokens=add)
        else:
            assert ids == stories.encode(text, add_special_tokens=add)
        assert cached.encode(text, add, max_fresh_chars=0) == stories.encode(text, add_special_tokens=add)


def test_encode_within_counts_only_what_the_cache_lacks(stories):
    cached = CachedTokenizer(stories, chunk_chars=64)
    prefix = "Once upon a time there was a little girl who loved to play in the park with her dog. " * 12
    assert cached.encode(prefix + "She found a ball.", True, max_fresh_chars=100) is None  # ~1,000 new chars
    assert cached.cached_pieces == 0 and cached.miss_tokens == 0  # declining did no work
    cached.encode(prefix + "She found a ball.")
    text = prefix + "Then she ran home to tell her mom."
    assert cached.encode(text, True, max_fresh_chars=100) == stories.encode(text)  # only the new tail


def test_a_slow_miss_in_one_thread_does_not_hold_up_hits_in_another(stories):
    """The event loop encodes cached text while a render thread tokenizes a huge new prompt."""
    import threading

    cached = CachedTokenizer(stories)
    cached.encode("Hello there", False)
    real, entered, release = cached.backend, threading.Event(), threading.Event()

    class Slow:
        def encode(self, text, add_special_tokens):
            if "slow" in text:
                entered.set()
                release.wait(30)
            return real.encode(text, add_special_tokens=add_special_tokens)

    cached.backend = Slow()
    thread = threading.Thread(target=cached.encode, args=("a slow new piece", False))
    thread.start()
    try:
        assert entered.wait(30)
        assert cached.encode("Hello there", False) == stories.encode("Hello there", add_special_tokens=False)
        assert thread.is_alive()  # the hit did not wait for the miss
    finally:
        release.set()
        thread.join()
    assert cached.encode("a slow new piece", False, max_fresh_chars=0) == stories.encode("a slow new piece",
                                                                                         add_special_tokens=False)
