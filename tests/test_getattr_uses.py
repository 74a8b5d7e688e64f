"""No ``getattr`` on kvmesh's own types: kvmesh reads its own objects through their declared attributes
and interfaces, never "whatever this object may have". What remains, listed here with its reason, is reflection
(a name taken from a declared field list or a registry), third-party objects (HF configs and tokenizers, torch,
Ray, argparse, triton, libc, exceptions) and the attention backends' module registry. A new ``getattr`` anywhere
fails until it is justified here.

Entries are keyed by (top-level folder, file name, attribute): ``*`` stands for a name computed at run time. The
file name alone (not its folder) keeps the guard through moves.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cluster", "events", "kvcache", "replica", "router")

REFLECTION = "a name from a declared field list, its own fields validated or copied"
REGISTRY = "a class or module named in a registry, loaded on first use"
THIRD_PARTY = "a third-party object whose attribute depends on its version or kind"

ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    # reflection over declared fields (config validation, to-dict, equality, counters)
    ("cluster", "autoscaler.py", "*"): (1, REFLECTION),
    ("cluster", "client.py", "*"): (1, REFLECTION),
    ("cluster", "fake_replica.py", "*"): (1, REFLECTION),
    ("cluster", "options.py", "*"): (3, REFLECTION),
    ("cluster", "replica_status.py", "*"): (1, REFLECTION),
    ("cluster", "report.py", "*"): (1, REFLECTION),
    ("cluster", "run.py", "*"): (3, REFLECTION + "; and a torch dtype by name"),
    ("cluster", "schema.py", "*"): (2, REFLECTION),
    ("cluster", "status.py", "*"): (1, REFLECTION),
    ("cluster", "supervisor.py", "*"): (2, REFLECTION),
    ("events", "config.py", "*"): (4, REFLECTION),
    ("events", "frame_guard.py", "*"): (1, REFLECTION),
    ("events", "state.py", "*"): (1, REFLECTION),
    ("replica", "config.py", "*"): (6, REFLECTION),
    ("replica", "cost_model.py", "*"): (1, REFLECTION),
    ("replica", "input_batch.py", "*"): (1, REFLECTION),
    ("replica", "kv_layout.py", "*"): (4, REFLECTION + " (MATCHING_FIELDS)"),
    ("replica", "metrics.py", "*"): (1, REFLECTION),
    ("replica", "outputs.py", "*"): (3, REFLECTION),
    ("replica", "refused_fields.py", "*"): (1, REFLECTION + " (the refused field names' table)"),
    ("router", "cache_aware_tokens_config.py", "*"): (1, REFLECTION),
    ("router", "spec.py", "*"): (1, REFLECTION),
    ("router", "metrics.py", "*"): (1, REFLECTION),
    ("router", "continuation.py", "*"): (2, REFLECTION),
    # registries
    ("replica", "agent.py", "*"): (1, REGISTRY + " (KV transfer transports)"),
    ("replica", "backend.py", "*"): (1, REGISTRY + " (attention backends)"),
    ("cluster", "kinds.py", "*"): (1, REGISTRY + " (the renderer of a generated table's kind)"),
    ("replica", "backend.py", "SUPPORTED_DEVICES"): (1, REGISTRY + ": a backend module's optional constant"),
    ("replica", "backend.py", "SUPPORTED_DTYPES"): (1, REGISTRY + ": a backend module's optional constant"),
    # third-party objects
    ("cluster", "kv_peer.py", "*"): (1, THIRD_PARTY + " (a torch dtype by name)"),
    ("cluster", "kv_transfer.py", "*"): (1, THIRD_PARTY + " (a torch dtype by name)"),
    ("cluster", "engine_ab.py", "*"): (1, THIRD_PARTY + " (argparse namespace)"),
    ("cluster", "flags.py", "*"): (1, THIRD_PARTY + " (argparse namespace)"),
    ("cluster", "vllm_forms.py", "*"): (1, THIRD_PARTY + " (argparse namespace: the positional MODEL)"),
    ("cluster", "flags.py", "config"): (1, THIRD_PARTY + " (argparse namespace)"),
    ("cluster", "cli.py", "func"): (1, THIRD_PARTY + " (argparse namespace)"),
    ("cluster", "engine.py", "flat"): (1, THIRD_PARTY + " (matplotlib axes)"),
    ("cluster", "model_files.py", "reason"): (1, THIRD_PARTY + " (urllib's exceptions)"),
    ("cluster", "ray_cluster.py", "ConsolePopen"): (1, THIRD_PARTY + " (Ray internals)"),
    ("cluster", "ray_cluster.py", "global_worker"): (1, THIRD_PARTY + " (Ray internals)"),
    ("cluster", "ray_cluster.py", "gcs_client"): (1, THIRD_PARTY + " (Ray internals)"),
    ("events", "conn_bytes.py", "malloc_trim"): (1, THIRD_PARTY + " (libc)"),
    ("replica", "chat_template.py", "*"): (1, "a template's attribute of a str, as jinja2's sandbox reads it "
                                              "(its str methods answered directly)"),
    ("replica", "detokenizer.py", "_tokenizer"): (1, THIRD_PARTY + " (HF tokenizer)"),
    ("replica", "tokenizer.py", "backend_tokenizer"): (1, THIRD_PARTY + " (HF tokenizer)"),
    ("replica", "tokenizer.py", "chat_template"): (2, THIRD_PARTY + " (HF tokenizer)"),
    ("replica", "tokenizer.py", "model_max_length"): (1, THIRD_PARTY + " (HF tokenizer)"),
    ("router", "tokenize_cache.py", "backend_tokenizer"): (1, THIRD_PARTY + " (HF tokenizer)"),
    ("router", "tokenize_cache.py", "encode_special_tokens"): (1, THIRD_PARTY + " (tokenizers' backend)"),
    ("router", "response_body.py", "aclose"): (1, THIRD_PARTY + " (an upstream byte stream)"),
    ("replica", "tp_agent.py", "cause"): (1, THIRD_PARTY + " (Ray's RayTaskError)"),
    ("replica", "triton_utils.py", "widens_bf16"): (1, THIRD_PARTY + " (triton's interpreter, patched once)"),
    ("replica", "triton_utils.py", "rounds_fp8"): (1, THIRD_PARTY + " (triton's interpreter, patched once)"),
    ("replica", "weights.py", "weight_loader"): (1, THIRD_PARTY + " (a torch Parameter's loader, vLLM's pattern)"),
    **{("replica", "model_config.py", name): (1, THIRD_PARTY + " (HF config)") for name in (
        "architectures", "attention_bias", "dtype", "eos_token_id", "head_dim", "max_position_embeddings",
        "mlp_bias", "model_type", "num_key_value_heads", "rope_parameters", "rope_scaling", "rope_theta",
        "sliding_window", "tie_word_embeddings", "torch_dtype")},
}


def getattr_uses() -> Counter[tuple[str, str, str]]:
    uses: Counter[tuple[str, str, str]] = Counter()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                    name = node.args[1] if len(node.args) > 1 else None
                    attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else "*"
                    uses[package, path.name, attr] += 1
    return uses


def test_every_getattr_is_one_the_list_allows():
    uses = getattr_uses()
    unexpected = {key: n for key, n in uses.items() if n > ALLOWED.get(key, (0, ""))[0]}
    assert not unexpected, (
        f"getattr uses not allowed: {unexpected}. Read kvmesh's own types through their declared attributes "
        "(a Protocol, a typed field, isinstance); list a registry or a third-party object here with its reason")


def test_the_list_has_no_stale_entries():
    uses = getattr_uses()
    stale = {key: n for key, (n, _) in ALLOWED.items() if uses.get(key, 0) < n}
    assert not stale, f"allowed getattr uses no longer in the code (lower or drop them): {stale}"
