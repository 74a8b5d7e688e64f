"""The FP8 KV cache through a replica's paths on stories260K (CPU, torch backend).

About twice the blocks of a bf16 cache in the same memory; a prompt pushed out to the host tier and loaded back,
and a P/D split with FP8 on both sides, answer the text one FP8 replica computes; a replica of another KV dtype
is refused by name and the prompt computed; a checkpoint's k/v scales are the layers' scales.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvmesh.replica.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.kv_layout import block_layout, symbolic_layout  # noqa: E402
from kvmesh.replica.kv_transfer.agent import KVTransferConfig, make_kv_transfer_agent  # noqa: E402
from kvmesh.replica.kv_transfer.errors import KVLayoutMismatch  # noqa: E402
from kvmesh.replica.worker.kv_scales import kv_scales_digest  # noqa: E402

from .kv_replicas import client, kv_replica, register  # noqa: E402
from .test_engine_host_tier import RecordingPublisher, generate, prompts  # noqa: E402
from .test_kv_transfer_http import FULL_BLOCK_TOKENS, complete, fresh_prompt  # noqa: E402


def engine(stories_path, **kw) -> LLMEngine:
    config = EngineConfig(model=str(stories_path), device="cpu", debug_check_integrity=True, **kw)
    return LLMEngine(config, event_publisher=RecordingPublisher())


def test_an_fp8_cache_holds_twice_the_blocks_of_a_bf16_one_in_the_same_memory(stories_path):
    bf16 = engine(stories_path, dtype="bfloat16", kv_cache_memory="2MiB")
    fp8 = engine(stories_path, dtype="bfloat16", kv_cache_memory="2MiB", kv_cache_dtype="fp8")
    assert bf16.model_runner.kv_cache.dtype == torch.bfloat16
    assert fp8.model_runner.kv_cache.dtype == torch.float8_e4m3fn
    assert fp8.model_runner.kv_layout.bytes_per_block * 2 == bf16.model_runner.kv_layout.bytes_per_block
    assert 2 * bf16.num_kv_blocks - 1 <= fp8.num_kv_blocks <= 2 * bf16.num_kv_blocks + 1
    e5m2 = engine(stories_path, kv_cache_memory="1MiB", kv_cache_dtype="fp8_e5m2")  # float32 model: 4x
    assert e5m2.model_runner.kv_cache.dtype == torch.float8_e5m2
    assert e5m2.num_kv_blocks >= 4 * engine(stories_path, kv_cache_memory="1MiB").num_kv_blocks - 1


def test_a_prompt_pushed_out_to_the_host_tier_comes_back_with_the_fp8_replicas_text(stories_path):
    tiered = engine(stories_path, kv_cache_dtype="fp8", kv_cache_memory="256KiB", kv_offload_memory="16MiB")
    assert 40 <= tiered.num_kv_blocks <= 70
    runner = tiered.model_runner
    assert runner.host_kv_cache.dtype == torch.float8_e4m3fn  # a host block is an FP8 block: half the bytes
    assert runner.num_host_blocks == (16 << 20) // runner.kv_layout.bytes_per_block
    long_prompt = prompts(1, 428, seed=0)[0]
    first = generate(tiered, "long", long_prompt)
    for i, other in enumerate(prompts(8, 300, seed=1)):  # each pushes most of the device pool out
        generate(tiered, f"other{i}", other)
    again = generate(tiered, "long-again", long_prompt)
    assert again.num_cached_tokens >= 256 and tiered.kv_cache_manager.offload.stats.hit_blocks * 16 >= 256
    one_replica = generate(engine(stories_path, kv_cache_dtype="fp8", kv_cache_memory="1MiB"), "one", long_prompt)
    assert again.output_token_ids == first.output_token_ids == one_replica.output_token_ids


def test_a_pd_split_with_fp8_on_both_sides_answers_the_fp8_replicas_text(stories_path):
    prompt = fresh_prompt(58)
    with kv_replica(stories_path, replica_id="a", kv_cache_dtype="fp8") as a, \
            kv_replica(stories_path, replica_id="b", kv_cache_dtype="fp8") as b, client(a) as ca, client(b) as cb:
        register(b, a)
        reference = complete(cb, prompt, cache_salt="computed").json()["choices"][0]["text"]
        handle = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()
        decode = complete(cb, prompt, kv_transfer_params={**handle["kv_transfer_params"], "remote_url": a.http.url})
        assert decode.headers["x-kvmesh-kv-pull"] == "ok"
        assert int(decode.headers["x-kvmesh-kv-pulled-tokens"]) == FULL_BLOCK_TOKENS
        assert decode.json()["choices"][0]["text"] == reference
        assert 'cache_dtype="fp8"' in cb.get("/metrics").text


def test_a_replica_of_another_kv_dtype_is_refused_naming_both_and_the_prompt_computed(stories_path, caplog):
    prompt = fresh_prompt(59)
    with kv_replica(stories_path, replica_id="a") as a, \
            kv_replica(stories_path, replica_id="b", kv_cache_dtype="fp8") as b, client(a) as ca, client(b) as cb:
        register(b, a)
        reference = complete(cb, prompt, cache_salt="computed").json()["choices"][0]["text"]
        handle = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()
        with caplog.at_level(logging.WARNING):
            decode = complete(cb, prompt, kv_transfer_params={**handle["kv_transfer_params"],
                                                              "remote_url": a.http.url})
        assert decode.headers["x-kvmesh-kv-pull"] == "failed" and decode.headers["x-kvmesh-kv-pulled-tokens"] == "0"
        assert decode.json()["choices"][0]["text"] == reference  # computed, not read from float32 bytes
        assert "KV cache dtype float8_e4m3fn" in caplog.text and "vs float32" in caplog.text


def test_the_transfer_handshake_names_both_kv_dtypes():
    def agent(name, dtype):
        shape = TorchAttentionBackend.kv_cache_shape(8, 4, 2, 8)
        cache = torch.zeros(3, *shape, dtype=dtype)
        layout = block_layout(cache, symbolic_layout(TorchAttentionBackend.kv_cache_shape), 4, 2, 8)
        return make_kv_transfer_agent(KVTransferConfig(transport="local"), name, cache, layout)

    plain, fp8 = agent("plain", torch.bfloat16), agent("fp8", torch.float8_e4m3fn)
    try:
        with pytest.raises(KVLayoutMismatch, match=r"KV cache dtype float8_e4m3fn on 'fp8' vs bfloat16 on 'plain' "
                                                   r"\(set the same kv_cache_dtype on both\)"):
            fp8.add_peer(plain.handshake())
        with pytest.raises(KVLayoutMismatch, match=r"KV cache dtype bfloat16 on 'plain' vs float8_e4m3fn on 'fp8'"):
            plain.add_peer(fp8.handshake())
    finally:
        plain.close()
        fp8.close()


def test_a_handshake_between_fp8_caches_with_other_scales_is_refused_naming_both_digests():
    def agent(name, digest):
        shape = TorchAttentionBackend.kv_cache_shape(8, 4, 2, 8)
        cache = torch.zeros(3, *shape, dtype=torch.float8_e4m3fn)
        layout = block_layout(cache, symbolic_layout(TorchAttentionBackend.kv_cache_shape), 4, 2, 8, digest)
        return make_kv_transfer_agent(KVTransferConfig(transport="local"), name, cache, layout)

    one, other, same = agent("one", "aa"), agent("other", "bb"), agent("same", "aa")
    try:
        with pytest.raises(KVLayoutMismatch, match=r"FP8 KV scales digest aa on 'one' vs bb on 'other' "
                                                   r"\(their caches quantize with other k/v scales"):
            one.add_peer(other.handshake())
        with pytest.raises(KVLayoutMismatch, match=r"scales_digest: bb vs aa"):
            other.add_peer(one.handshake())
        assert one.add_peer(same.handshake())  # the same scales: paired
    finally:
        for a in (one, other, same):
            a.close()


def test_the_scales_digest_is_empty_without_scales_and_changes_with_any_scale():
    def layers(*pairs):
        return [SimpleNamespace(kv_scales=None if p is None else tuple(torch.tensor([v]) for v in p)) for p in pairs]

    assert kv_scales_digest(layers(None, None)) == ""
    digest = kv_scales_digest(layers((1.0, 1.0), (0.5, 2.0)))
    assert len(digest) == 16 and digest == kv_scales_digest(layers((1.0, 1.0), (0.5, 2.0)))
    assert digest != kv_scales_digest(layers((1.0, 1.0), (0.5, 2.5)))  # one v_scale differs
    assert digest != kv_scales_digest(layers((0.5, 2.0), (1.0, 1.0)))  # the same scales on other layers


def test_checkpoint_kv_scales_become_the_layers_scales_and_their_absence_is_logged(stories_path, tmp_path, caplog):
    from safetensors.torch import save_file

    for name in os.listdir(stories_path):
        os.symlink(os.path.join(stories_path, name), tmp_path / name)
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
               "model.layers.0.self_attn.v_scale": torch.tensor(2.0),
               "model.layers.1.self_attn.kv_scale": torch.tensor(0.25)}, str(tmp_path / "kv_scales.safetensors"))
    with caplog.at_level(logging.INFO):
        scaled = engine(tmp_path, kv_cache_dtype="fp8", kv_cache_memory="1MiB")
    layers = scaled.model_runner.model.attention_layers()
    got = [(attn.kv_scales[0].item(), attn.kv_scales[1].item()) for attn in layers]
    assert got[:3] == [(0.5, 2.0), (0.25, 0.25), (1.0, 1.0)]
    assert f"scales for 2 of {len(layers)} layers; the others use 1.0" in caplog.text
    assert scaled.model_runner.kv_layout.scales_digest == kv_scales_digest(layers) != ""  # what the handshake says
    plain = engine(tmp_path, kv_cache_memory="1MiB")  # a model-dtype cache loads the checkpoint, scales unused
    assert all(attn.kv_scales is None for attn in plain.model_runner.model.attention_layers())
    assert plain.model_runner.kv_layout.scales_digest == ""
    prompt = prompts(1, 40, seed=3)[0]
    assert generate(scaled, "s", prompt).output_token_ids  # the scaled cache decodes


def test_block_hashes_and_events_are_those_of_the_model_dtype_cache(stories_path):
    """The tokens say what a block holds; the dtype is the replica's: the same prompt stores the same blocks (its
    prompt's: the generated text may differ with the rounding)."""
    from kvmesh.events.schema import BlockStored

    def stored(kv_cache_dtype: str) -> list:
        eng = engine(stories_path, kv_cache_dtype=kv_cache_dtype, kv_cache_memory="1MiB", hash_seed="one-cluster")
        generate(eng, "p", prompts(1, 100, seed=4)[0], max_tokens=1)
        return [(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.medium)
                for e in eng.event_publisher.events if type(e) is BlockStored]

    fp8 = stored("fp8")
    assert sum(len(hashes) for hashes, *_ in fp8) == 100 // 16 and fp8 == stored("auto")
