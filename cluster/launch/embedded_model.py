"""The embedded default model: a tiny Llama with RANDOM weights, built locally without internet.

`kvmesh serve` with no ``--model`` serves this so that a fresh clone works on a machine with no
GPU, no network and no model files. Its text is random (the weights are ``load_format="dummy"``);
it exists to exercise the whole cluster: tokenization, paged KV cache, events, routing.

What is built, into ``$KVMESH_CACHE_DIR`` (default ``~/.cache/kvmesh``)/embedded-llama-<digest>/:

    config.json             LlamaConfig (4 layers, hidden 128, GQA 4/2 heads, 2048 context)
    tokenizer.json          byte-level BPE trained here on a small built-in text
    tokenizer_config.json   PreTrainedTokenizerFast, <s>/</s>, a plain chat template
    generation_config.json

The files are made once in the driver (``embedded_model_files``) and written on every node by
``materialize`` (content-addressed, atomic), so every replica and the router read identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.replica.openai.config import FrontendConfig

SERVED_NAME = "kvmesh-embedded"
TOOL_CALL_PARSER = "hermes"
"""How the embedded model's tool calls are read when a chat leaves ``tool_choice`` "auto" (served by default)."""
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 as in Llama
TARGET_VOCAB = 1024

_CORPUS = """\
Once upon a time there was a little robot who lived in a big server room. Every day the robot
carried blocks of memory from one rack to another. The blocks were full of words, and the words
were full of stories. One day a message arrived: "Please tell me a story about a cat and a dog."
The robot looked in its cache. It had seen the beginning of that story before, so it did not
need to think about it again. It only thought about the new part, and the answer was quick.
The cat and the dog were friends. They played in the garden, they ran after the ball, and when
the sun went down they slept in the warm house. The girl who lived there was called Lily. Lily
liked to read books with her mother, and she asked many questions: why is the sky blue, why do
birds sing, where does the rain go? Her mother smiled and said that the world is full of answers
for those who keep asking. The router listened to every request and sent it to the replica that
remembered the most. Hello, how are you today? I am fine, thank you. What would you like to
know? Tell me about the weather, the mountains, the rivers and the sea. The quick brown fox
jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. User: hi! Assistant: hello.
"""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def llama_config(vocab_size: int) -> dict:
    """A small Llama-architecture HF config (random weights are made from it by the engine)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 344,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "torch_dtype": "float32",
        "initializer_range": 0.02, "use_cache": True,
    }


@lru_cache(maxsize=1)
def embedded_model_files() -> dict[str, str]:
    """File name -> text of the embedded model directory (deterministic; a second or so)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    vocab_size = -(-tokenizer.get_vocab_size() // 64) * 64  # round up: embedding rows are padded
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "model_max_length": 2048,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }
    return {
        "config.json": json.dumps(llama_config(vocab_size), indent=2, sort_keys=True),
        "tokenizer.json": tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2, sort_keys=True),
        "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2),
        "README.md": "kvmesh embedded model: tiny Llama, RANDOM weights (load_format=dummy); its text is noise.\n",
    }


def cache_dir() -> Path:
    root = os.environ.get("KVMESH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvmesh")
    return Path(root)


def materialize(files: dict[str, str], root: Path | None = None) -> str:
    """Write ``files`` into a content-addressed directory (once; atomic) and return its path."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    root = root or cache_dir()
    target = root / f"embedded-llama-{digest}"
    if (target / "config.json").exists():
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".embedded-", dir=root))
    for name, text in files.items():
        (tmp / name).write_text(text)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its copy is identical
        for child in tmp.iterdir():
            child.unlink()
        tmp.rmdir()
    return str(target)


def served_frontend(frontend: FrontendConfig, model: str) -> FrontendConfig:
    """The front end the router and replicas of ``model`` get. The embedded model's format is kvmesh's own, so it
    serves ``tool_choice: "auto"`` (the default when a chat sends tools, and what agent loops send after their
    first call) with the hermes parser unless the config names a parser; a model you name needs
    ``--enable-auto-tool-choice --tool-call-parser``, as in vLLM."""
    from kvmesh.cluster.config.trees import EMBEDDED_MODEL

    if model != EMBEDDED_MODEL or frontend.tool_call_parser is not None:
        return frontend
    return replace(frontend, enable_auto_tool_choice=True, tool_call_parser=TOOL_CALL_PARSER)
