"""What kvmesh does with each flag a ``vllm serve`` command commonly carries: the one table.

A start script written for vLLM should start kvmesh, or fail saying what to write instead. Each flag is one of:

- ``Same``: kvmesh has the flag, with vLLM's meaning (docs/cli.md lists it with kvmesh's own help);
- ``Mapped``: taken as a kvmesh flag of another name (``-tp`` is ``--tensor-parallel-size``; ``--enforce-eager``
  is ``--no-cuda-graphs``), with one line at start-up saying so unless it is only another spelling;
- ``NoEffect``: accepted, changing nothing, with one line at start-up saying why (only the values listed, when a
  value could ask for what kvmesh lacks);
- ``Refused``: an error naming what kvmesh does instead.

cluster/config/vllm_no_effect.py turns the table into argparse actions for ``kvmesh serve``, ``kvmesh replica`` and
``kvmesh router``; cluster/cli_reference.py writes docs/cli.md's table from it; tests/cluster/test_vllm_flag_table.py
gives every row to ``kvmesh serve`` and checks its treatment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Same:
    """kvmesh defines the flag, with vLLM's meaning."""

    example: str | None
    """A value a start script gives (None: a switch)."""
    remark: str = ""
    """Where kvmesh's values differ from vLLM's (the docs say it)."""
    on_cpu: str = ""
    """Said once at start-up when the flag is given and the replicas run on CPU, where it changes nothing."""
    along: tuple[str, ...] = ()
    """The flags it needs beside it (in vLLM too), as a start script gives them."""


@dataclass(frozen=True, slots=True)
class Mapped:
    """Taken as kvmesh's flag ``to`` (its value converted by ``value``)."""

    to: str
    """kvmesh's flag (``--no-x`` for a switch that turns x off)."""
    example: str | None
    """A value a start script gives (None: a switch)."""
    value: Callable[[str], str] | None = None
    """vLLM's value -> kvmesh's (None: the same text)."""
    spelling: bool = False
    """Only another spelling of ``to`` (``-tp``): no start-up line."""
    remark: str = ""
    """How the value is converted, or where kvmesh's flag differs (the docs say it)."""


@dataclass(frozen=True, slots=True)
class NoEffect:
    """Why the flag changes nothing in kvmesh, and for which of its values."""

    why: str
    """What kvmesh does that makes the flag moot (the start-up line says it)."""
    takes_value: bool = False
    """vLLM's flag takes a value (else it is a switch)."""
    values: tuple[str, ...] | None = None
    """The values that change nothing (None: any); another is an error."""
    otherwise: str = ""
    """What the error for another value says kvmesh does instead."""

    @property
    def example(self) -> str | None:
        return None if not self.takes_value else self.values[-1] if self.values else "100"


@dataclass(frozen=True, slots=True)
class Refused:
    """A flag kvmesh does not take: the error says what to do instead."""

    instead: str
    """kvmesh's way (the error and the docs say it)."""
    example: str | None = "1"
    """A value a start script gives (None: a switch)."""


Treatment = Same | Mapped | NoEffect | Refused


def vllm_size(text: str) -> str:
    """vLLM's human-readable bytes (``1G`` = 1 GiB, ``1g`` = 10^9) in kvmesh's size words (``1GiB``)."""
    binary = {"K": "KiB", "M": "MiB", "G": "GiB", "T": "TiB"}
    return text[:-1] + binary[text[-1]] if text and text[-1] in binary else text


def gib(text: str) -> str:
    """vLLM's GiB count (``--kv-offloading-size 4``) as kvmesh's size."""
    return f"{text}GiB"


_TEXT_ONLY = "kvmesh serves text: a request with an image or audio part is refused"
_NO_LOG = "kvmesh logs no request's prompt or parameters"
_TEXT_GENERATION = "kvmesh serves text generation only (no embeddings, scoring or pooling)"
_PARSERS = "kvmesh runs no plugin code; its tool-call parsers are hermes and llama3_json (--tool-call-parser)"
_TLS = "kvmesh serves plain HTTP: put a TLS-terminating proxy or load balancer in front of the router"
_CORS = "kvmesh sends no CORS headers: let the proxy in front of the router add them"
_REVISION = ("kvmesh serves a directory or the hub cache's main revision: `hf download MODEL --revision REV "
             "--local-dir DIR`, then serve DIR")
_PP = "kvmesh shards a model with tensor parallelism only: use --tensor-parallel-size"
_DP = "each replica is its own engine behind the cache-aware router: use --num-replicas"
_GRAPHS = "kvmesh compiles no model graph; its CUDA graphs are --cuda-graphs / --no-cuda-graphs"
_QUANT = "not supported: weights load in --dtype (--kv-cache-dtype fp8 halves the KV cache)"

VLLM_SERVE_FLAGS: dict[str, Treatment] = {
    # the model and its files
    "--model": Same("/models/m"),
    "--tokenizer": Same("/models/m"),
    "--served-model-name": Same("m"),
    "--dtype": Same("half", remark="half and float are taken as float16 and float32"),
    "--trust-remote-code": NoEffect("kvmesh runs no remote code: it serves the model families it implements with "
                                    "its own code, whatever the model directory ships"),
    "--no-trust-remote-code": NoEffect("kvmesh runs no remote code"),
    "--code-revision": NoEffect("kvmesh runs no remote code", takes_value=True),
    "--revision": Refused(_REVISION, example="main"),
    "--tokenizer-revision": Refused(_REVISION, example="main"),
    "--download-dir": Refused("kvmesh reads hub models from the Hugging Face cache: set HF_HUB_CACHE=DIR",
                              example="/tmp"),
    "--load-format": Same("safetensors", remark="auto, safetensors or dummy"),
    "--max-model-len": Same("64"),
    "--hf-overrides": Same('{"num_hidden_layers": 2}'),
    "--rope-scaling": Refused("use --hf-overrides '{\"rope_scaling\": {...}}'", example="{}"),
    "--tokenizer-mode": NoEffect("kvmesh uses the model's Hugging Face tokenizer", takes_value=True,
                                 values=("hf", "auto"),
                                 otherwise="kvmesh uses the model's Hugging Face tokenizer only (--tokenizer to change "
                                           "it)"),
    "--config-format": NoEffect("kvmesh reads the model's Hugging Face config.json", takes_value=True,
                                values=("hf", "auto"), otherwise="kvmesh reads Hugging Face config.json only"),
    "--model-impl": NoEffect("kvmesh runs its own implementation of each model it serves", takes_value=True,
                             values=("vllm", "auto"), otherwise="kvmesh runs its own implementation of each model"),
    "--task": NoEffect("kvmesh serves text generation", takes_value=True, values=("generate", "auto"),
                       otherwise=_TEXT_GENERATION),
    "--runner": NoEffect("kvmesh serves text generation", takes_value=True, values=("generate", "auto"),
                         otherwise=_TEXT_GENERATION),
    "--quantization": Refused(_QUANT, example="awq"),
    "-q": Refused(_QUANT, example="awq"),
    "--max-logprobs": NoEffect("a request may ask for up to 20 top logprobs per token, vLLM's default",
                               takes_value=True, values=("20",),
                               otherwise="kvmesh's limit is 20 top logprobs per token (OpenAI's), fixed"),
    # parallelism, memory and the engine's step
    "--tensor-parallel-size": Same("1"),
    "-tp": Mapped("--tensor-parallel-size", "1", spelling=True),
    "--pipeline-parallel-size": Refused(_PP, example="2"),
    "-pp": Refused(_PP, example="2"),
    "--data-parallel-size": Refused(_DP, example="2"),
    "-dp": Refused(_DP, example="2"),
    "--distributed-executor-backend": NoEffect(
        "replicas and their tensor-parallel workers always run on Ray", takes_value=True, values=("mp", "uni", "ray"),
        otherwise="replicas and their tensor-parallel workers always run on Ray"),
    "--gpu-memory-utilization": Same("0.9", on_cpu="the replicas run on CPU, where the KV cache is sized by "
                                                   "--kv-cache-memory (1 GiB per replica unless set)"),
    "--kv-cache-memory-bytes": Mapped("--kv-cache-memory", "1G", value=vllm_size,
                                      remark="1G is 1 GiB and 1g 10^9 bytes, as in vLLM"),
    "--max-num-seqs": Same("8"),
    "--max-num-batched-tokens": Same("512"),
    "--enable-chunked-prefill": NoEffect("prefills are always chunked: --max-num-batched-tokens sets the step's "
                                         "token budget"),
    "--no-enable-chunked-prefill": Refused("prefills are always chunked; a --max-num-batched-tokens of at least "
                                           "--max-model-len prefills any prompt in one step", example=None),
    "--enable-prefix-caching": Same(None),
    "--no-enable-prefix-caching": Same(None),
    "--block-size": Same("16"),
    "--kv-cache-dtype": Same("fp8"),
    "--swap-space": NoEffect("a preempted request is recomputed, mostly from its cached prefix, as in vLLM's v1 "
                             "engine (--kv-offload-memory adds a host-memory tier)", takes_value=True),
    "--cpu-offload-gb": Refused("not supported: weights stay on the device; --kv-offload-memory offloads KV blocks",
                                example="4"),
    "--kv-offloading-size": Mapped("--kv-offload-memory", "4", value=gib, remark="vLLM's GiB: 4 is 4GiB"),
    "--num-gpu-blocks-override": Mapped("--num-kv-blocks", "100", remark="a cap on the blocks the scheduler uses"),
    "--enforce-eager": Mapped("--no-cuda-graphs", None),
    "--compilation-config": Refused(_GRAPHS, example="{}"),
    "-O": Refused(_GRAPHS, example="3"),
    "--async-scheduling": Same(None),
    "--enable-expert-parallel": NoEffect("kvmesh serves dense models: there are no experts to place"),
    "--disable-custom-all-reduce": NoEffect("tensor-parallel all-reduce is torch.distributed's (NCCL on GPUs)"),
    "--seed": Same("0"),
    "--device": Same("cpu"),
    "--scheduling-policy": Same("priority"),
    "--enable-sleep-mode": Refused("kvmesh has no sleep mode: `kvmesh drain` and `kvmesh scale` take replicas out "
                                   "and give their devices back", example=None),
    "--disable-sliding-window": Refused("kvmesh attends over the whole context; a --max-model-len of the model's "
                                        "window keeps sequences within it", example=None),
    "--headless": Refused("several nodes are one Ray cluster (`ray up deploy/...`), served by `kvmesh serve "
                          "--address auto` on its head", example=None),
    # the HTTP server
    "--host": Same("127.0.0.1"),
    "--port": Same("8000"),
    "--api-key": Same("a-secret-key"),
    "--api-server-count": Mapped("--workers", "2"),
    "-asc": Mapped("--workers", "2", spelling=True),
    "--root-path": Refused("kvmesh serves its API at /v1; let the proxy in front strip its path prefix",
                           example="/llm"),
    "--ssl-keyfile": Refused(_TLS, example="key.pem"),
    "--ssl-certfile": Refused(_TLS, example="cert.pem"),
    "--ssl-ca-certs": Refused(_TLS, example="ca.pem"),
    "--allowed-origins": Refused(_CORS, example='["*"]'),
    "--allow-credentials": Refused(_CORS, example=None),
    "--uds": Refused("kvmesh listens on TCP: --host and --port", example="/tmp/kvmesh.sock"),
    "--uvicorn-log-level": NoEffect(
        "kvmesh sets its own logging: --verbose (serve), --log-level (router)", takes_value=True,
        values=("critical", "error", "warning", "info", "debug", "trace"),
        otherwise="not one of vLLM's levels (critical, error, warning, info, debug, trace)"),
    "--disable-uvicorn-access-log": NoEffect("kvmesh's HTTP servers write no access log (the router's --access-log "
                                             "turns one on)"),
    "--disable-log-requests": NoEffect(_NO_LOG),
    "--no-enable-log-requests": NoEffect(_NO_LOG),
    "--enable-log-requests": Refused(_NO_LOG + "; the router's --access-log writes a line per request", example=None),
    "--enable-log-outputs": Refused("kvmesh logs no outputs; the router's --access-log writes a line per request",
                                    example=None),
    "--disable-log-stats": NoEffect("kvmesh logs no periodic engine statistics (GET /metrics has them)"),
    "--max-log-len": NoEffect("kvmesh logs no prompts", takes_value=True),
    "--disable-fastapi-docs": NoEffect("kvmesh serves no /docs, /redoc or /openapi.json"),
    "--disable-frontend-multiprocessing": NoEffect("a replica's HTTP server runs in its engine's process"),
    "--enable-server-load-tracking": NoEffect("every replica tracks its load and reports it (GET /load, in kvmesh's "
                                              "shape)"),
    "--enable-prompt-tokens-details": NoEffect("usage.prompt_tokens_details.cached_tokens is always reported"),
    "--response-role": NoEffect("answers' role is assistant", takes_value=True, values=("assistant",),
                                otherwise="kvmesh's answers always have the role assistant"),
    "--return-tokens-as-token-ids": Refused("send return_tokens_as_token_ids: true in the request (kvmesh takes it "
                                            "per request)", example=None),
    # chat, tools, reasoning and structured outputs
    "--chat-template": Same("{% for m in messages %}{{ m['content'] }}{% endfor %}",
                            remark="a template file's path or the template's text; a path naming no file is refused"),
    "--chat-template-content-format": NoEffect(
        "a message's text parts reach the chat template as one string", takes_value=True, values=("auto", "string"),
        otherwise="kvmesh gives the chat template a message's text parts as one string (vLLM's string format)"),
    "--enable-auto-tool-choice": Same(None, along=("--tool-call-parser", "hermes")),
    "--tool-call-parser": Same("hermes", remark="hermes or llama3_json"),
    "--tool-parser-plugin": Refused(_PARSERS, example="parser.py"),
    "--reasoning-parser": Same("qwen3", remark="deepseek_r1 or qwen3"),
    "--guided-decoding-backend": NoEffect(
        "structured outputs always use xgrammar", takes_value=True, values=("xgrammar", "auto"),
        otherwise="kvmesh's structured outputs use xgrammar only: give xgrammar or auto, or leave the flag out"),
    "--structured-outputs-config": Refused("kvmesh's structured outputs use xgrammar; its settings are the "
                                           "--structured-outputs-* flags", example='{"backend": "xgrammar"}'),
    "--generation-config": NoEffect(
        "kvmesh's default sampling parameters are vLLM's own (the model's generation_config.json gives only its "
        "end-of-sequence ids)", takes_value=True, values=("vllm",),
        otherwise="kvmesh takes no default sampling parameters from a generation config: requests set their own "
                  "(temperature, top_p, ...); give vllm or leave the flag out"),
    "--override-generation-config": Refused("requests set their own sampling parameters (temperature, top_p, ...); "
                                            "kvmesh takes no server-wide defaults", example='{"temperature": 0.6}'),
    "--logits-processors": Refused("kvmesh runs no plugin code; requests' logit_bias, allowed_token_ids and "
                                   "structured outputs shape the logits", example="my.Processor"),
    "--speculative-config": Same('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'),
    "--limit-mm-per-prompt": NoEffect(_TEXT_ONLY, takes_value=True),
    "--allowed-local-media-path": NoEffect(_TEXT_ONLY, takes_value=True),
    # LoRA adapters
    "--enable-lora": Same(None),
    "--lora-modules": Same("a=/adapters/a", along=("--enable-lora",)),
    "--max-loras": Same("2"),
    "--max-lora-rank": Same("16"),
    "--max-cpu-loras": Same("2"),
    # KV events, transfer and the cache's keys
    "--kv-events-config": Refused("every replica publishes KV events (vLLM's wire format): set --event-port / "
                                  "--topic", example="{}"),
    "--kv-transfer-config": Refused("use --kv-transfer (and --kv-peer) to move KV blocks between replicas",
                                    example="{}"),
    "--prefix-caching-hash-algo": Refused("blocks are hashed with xxh3_128 under the cluster's secret seed "
                                          "(KVMESH_HASH_SEED)", example="sha256"),
}
"""``vllm serve`` flag -> what kvmesh does with it, in the order docs/cli.md lists them."""
