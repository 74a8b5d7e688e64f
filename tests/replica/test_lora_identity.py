"""An adapter's blocks are keyed by its identity (a digest of its weights and scale), not its name alone, on a real
stories260K engine: unloaded and loaded again from other weights -- another directory, or its own directory
rewritten -- a name gives the new weights' greedy text, never the old weights' KV; the same files give the same
identity (two replicas agree); weights or a scale that are not finite are refused by name."""

from __future__ import annotations

import json
import random
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from kvmesh.kvcache.hashing import RequestBlockHasher, make_none_hash  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.lora.peft_config import LoRAError  # noqa: E402
from kvmesh.replica.serving.lora_request import LoRARequest  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .lora_fixtures import make_adapter  # noqa: E402
from .test_lora_engine import make_engine  # noqa: E402

PROMPT = [random.Random(44).randrange(3, 500) for _ in range(121)]  # 7 full blocks of 16 (the attack's 112 tokens)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def weights(stories_path, tmp_path_factory):
    """Two PEFT directories of one shape: ``old`` and ``new`` weights."""
    root = tmp_path_factory.mktemp("identity")
    make_adapter(stories_path, root / "old", seed=11)
    make_adapter(stories_path, root / "new", seed=12)
    return root


def run(engine, request_id: str, lora: LoRARequest | None):
    engine.add_request(EngineRequest(request_id, PROMPT, GREEDY, lora_request=lora))
    for _ in range(200):
        for out in engine.step():
            if out.finished and out.request_id == request_id:
                assert out.finish_reason == "length", out.error
                return out
    raise AssertionError(f"{request_id} never finished")


@pytest.mark.parametrize("where", ["another directory", "its directory rewritten"])
def test_an_adapter_loaded_again_from_other_weights_gives_the_new_weights_text(stories_path, weights, tmp_path, where):
    own = tmp_path / "x"
    shutil.copytree(weights / "old", own)
    engine = make_engine(stories_path)
    assert engine.add_lora(LoRARequest("x", 1, str(own)))
    old = run(engine, "old", LoRARequest("x", 1, str(own)))
    assert engine.remove_lora("x")
    if where == "another directory":
        again = LoRARequest("x", 2, str(weights / "new"))
    else:
        shutil.rmtree(own)
        shutil.copytree(weights / "new", own)
        again = LoRARequest("x", 1, str(own))  # name, id and path as before: only the files changed
    assert engine.add_lora(again)
    reloaded = run(engine, "reloaded", again)
    assert engine.add_lora(LoRARequest("fresh", 3, str(weights / "new")))
    fresh = run(engine, "fresh", LoRARequest("fresh", 3, str(weights / "new")))
    assert old.output_token_ids != fresh.output_token_ids  # the two weights do differ on this prompt
    assert reloaded.num_cached_tokens == 0  # none of the old weights' 112 cached prompt tokens
    assert reloaded.output_token_ids == fresh.output_token_ids
    again_cached = run(engine, "again", again)
    assert again_cached.num_cached_tokens == 112 and again_cached.output_token_ids == fresh.output_token_ids


def test_the_same_files_give_the_same_identity_and_it_keys_every_block(stories_path, weights, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(weights / "old", copy)
    engine = make_engine(stories_path)
    for i, (name, path) in enumerate((("a", weights / "old"), ("b", copy), ("c", weights / "new")), 1):
        engine.add_lora(LoRARequest(name, i, str(path)))
    ident = {lora.lora_name: lora.identity for lora in engine.list_loras()}
    assert ident["a"] == ident["b"] != ident["c"] and len(ident["a"]) == 32
    assert engine.loras.load([]).identities == ident
    hasher = RequestBlockHasher(16, make_none_hash(b"s"), None, "a", ident["a"])
    assert hasher.extra_keys(0) == hasher.extra_keys(3) == ("a", ident["a"])
    by_name_only = RequestBlockHasher(16, make_none_hash(b"s"), None, "a")
    assert hasher.extend(PROMPT) != by_name_only.extend(PROMPT)


def test_another_scale_is_another_identity(stories_path, weights, tmp_path):
    doubled = tmp_path / "doubled"
    shutil.copytree(weights / "old", doubled)
    config = json.loads((doubled / "adapter_config.json").read_text())
    (doubled / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 2 * config["lora_alpha"]}))
    engine = make_engine(stories_path)
    engine.add_lora(LoRARequest("a", 1, str(weights / "old")))
    engine.add_lora(LoRARequest("b", 2, str(doubled)))
    a, b = sorted(engine.list_loras(), key=lambda lora: lora.lora_name)
    assert a.identity != b.identity


def poisoned(src, dst, value: float):
    """A copy of ``src`` whose first lora_B tensor holds ``value`` once; the tensor's name."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "adapter_model.safetensors")
    name = sorted(n for n in tensors if "lora_B" in n)[0]
    tensors[name][0, 0] = value
    save_file(tensors, dst / "adapter_model.safetensors", metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(stories_path, weights, tmp_path, value):
    name = poisoned(weights / "old", tmp_path / "bad", value)
    engine = make_engine(stories_path)
    with pytest.raises(LoRAError, match=f"tensor '{name}' holds NaN or infinite values"):
        engine.add_lora(LoRARequest("bad", 1, str(tmp_path / "bad")))
    assert engine.list_loras() == []


@pytest.mark.parametrize("alpha", ["Infinity", "-Infinity", "NaN", "0", "-16"])
def test_a_scale_that_is_not_finite_and_positive_is_refused_naming_lora_alpha(stories_path, weights, tmp_path, alpha):
    bad = tmp_path / "bad"
    shutil.copytree(weights / "old", bad)
    text = (bad / "adapter_config.json").read_text()
    config = json.loads(text)
    (bad / "adapter_config.json").write_text(text.replace(f'"lora_alpha": {config["lora_alpha"]}',
                                                          f'"lora_alpha": {alpha}'))
    assert json.loads((bad / "adapter_config.json").read_text())["lora_alpha"] != config["lora_alpha"]
    engine = make_engine(stories_path)
    with pytest.raises(LoRAError, match="lora_alpha must be a finite positive number"):
        engine.add_lora(LoRARequest("bad", 1, str(bad)))
