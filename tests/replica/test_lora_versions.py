"""An adapter reloaded under its name while its requests run, on a real stories260K engine: each request is served
by the version it started with, start to end. Requests run under the old weights; the name is unloaded and loaded
again from other weights (another directory, or its own directory rewritten: same name, id and path) mid-way;
requests under the new version start beside them. Every answer is exactly the old or the new weights' greedy text,
with one device slot or two (one slot: the versions take turns), and once the old version's last request ends its
weights leave the runner."""

from __future__ import annotations

import random
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.serving.lora_request import LoRARequest  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .lora_fixtures import make_adapter  # noqa: E402
from .test_lora_engine import make_engine  # noqa: E402

PROMPTS = [[random.Random(s).randrange(3, 500) for _ in range(40)] for s in range(3)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def weights(stories_path, tmp_path_factory):
    """Two PEFT directories of one shape, ``old`` and ``new``, and each one's greedy tokens per prompt (run alone)."""
    root = tmp_path_factory.mktemp("versions")
    make_adapter(stories_path, root / "old", seed=21)
    make_adapter(stories_path, root / "new", seed=22)
    engine = make_engine(stories_path)
    texts = {}
    for i, version in enumerate(("old", "new"), 1):
        lora = LoRARequest(version, i, str(root / version))
        engine.add_lora(lora)
        finals = run(engine, {f"{version}-{p}": (prompt, lora) for p, prompt in enumerate(PROMPTS)})
        texts[version] = [finals[f"{version}-{p}"] for p in range(len(PROMPTS))]
    assert all(a != b for a, b in zip(texts["old"], texts["new"], strict=True))  # the weights do differ
    return root, texts


def run(engine, requests: dict, steps: int = 400) -> dict[str, list[int]]:
    """Add ``requests`` (id -> (prompt, adapter)) and step until they end; each one's output tokens."""
    for rid, (prompt, lora) in requests.items():
        engine.add_request(EngineRequest(rid, prompt, GREEDY, lora_request=lora))
    return finish(engine, set(requests), steps)


def finish(engine, ids: set[str], steps: int = 400, finals: dict | None = None) -> dict[str, list[int]]:
    finals = {} if finals is None else finals
    for _ in range(steps):
        for out in engine.step():
            if out.finished and out.request_id in ids:
                assert out.finish_reason == "length", out.error
                finals[out.request_id] = out.output_token_ids
        if ids <= finals.keys():
            return finals
    raise AssertionError(f"{sorted(ids - finals.keys())} never finished")


def advance(engine, steps: int, finals: dict) -> None:
    for _ in range(steps):
        for out in engine.step():
            if out.finished:
                assert out.finish_reason == "length", out.error
                finals[out.request_id] = out.output_token_ids


@pytest.mark.parametrize("max_loras", [1, 2])
@pytest.mark.parametrize("where", ["another directory", "its directory rewritten"])
def test_each_request_keeps_the_version_it_started_with(stories_path, weights, tmp_path, where, max_loras):
    root, texts = weights
    own = tmp_path / "x"
    shutil.copytree(root / "old", own)
    engine = make_engine(stories_path, max_loras=max_loras)
    old = LoRARequest("x", 1, str(own))
    engine.add_lora(old)
    finals: dict[str, list[int]] = {}
    for p, prompt in enumerate(PROMPTS):  # old-version requests, started a few steps apart
        engine.add_request(EngineRequest(f"old-{p}", prompt, GREEDY, lora_request=old))
        advance(engine, 3, finals)
    assert not finals  # all still running
    assert engine.remove_lora("x")
    if where == "another directory":
        new = LoRARequest("x", 2, str(root / "new"))
    else:
        shutil.rmtree(own)
        shutil.copytree(root / "new", own)
        new = LoRARequest("x", 1, str(own))  # name, id and path as before: only the files changed
    assert engine.add_lora(new)
    for p, prompt in enumerate(PROMPTS):
        engine.add_request(EngineRequest(f"new-{p}", prompt, GREEDY, lora_request=new))
        advance(engine, 2, finals)
    ids = {f"{v}-{p}" for v in ("old", "new") for p in range(len(PROMPTS))}
    finish(engine, ids, finals=finals)
    mixed = {rid: out for rid, out in finals.items() if out != texts[rid.split("-")[0]][int(rid.split("-")[1])]}
    assert not mixed, f"{len(mixed)} of {len(ids)} answers are not their version's text: {sorted(mixed)}"
    manager = engine.loras.runner.lora
    assert [name for name, _ in manager.host] == ["x"]  # the old version left with its last request


def test_a_name_reloaded_twice_while_both_older_versions_run(stories_path, weights):
    root, texts = weights
    engine = make_engine(stories_path, max_loras=2)
    v1, v2, v3 = (LoRARequest("x", i, str(root / d)) for i, d in ((1, "old"), (2, "new"), (3, "old")))
    engine.add_lora(v1)
    finals: dict[str, list[int]] = {}
    engine.add_request(EngineRequest("v1", PROMPTS[0], GREEDY, lora_request=v1))
    advance(engine, 4, finals)
    for rid, lora in (("v2", v2), ("v3", v3)):
        engine.remove_lora("x")
        engine.add_lora(lora)
        engine.add_request(EngineRequest(rid, PROMPTS[0], GREEDY, lora_request=lora))
        advance(engine, 4, finals)
    finish(engine, {"v1", "v2", "v3"}, finals=finals)
    assert finals["v1"] == finals["v3"] == texts["old"][0] and finals["v2"] == texts["new"][0]
