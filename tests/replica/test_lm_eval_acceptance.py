"""Acceptance with a real client: lm-evaluation-harness's ``local-completions`` model scores a
loglikelihood (multiple-choice) task and a generation task from local JSONL files against a kvmesh
replica serving stories260K. Nothing is downloaded (HF_*_OFFLINE=1; the tokenizer is the local one).

lm-eval scores a choice by sending prompt = context + continuation with ``echo: true, logprobs: 1,
max_tokens: 1`` (a batch of token-id prompts per request) and summing ``token_logprobs[ctxlen:-1]``;
those sums must equal transformers' log-likelihoods of the continuations.
"""

from __future__ import annotations

import json
import math

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed (pip install lm-eval)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MC_DOCS = [
    {"context": "Once upon a time, there was a little girl named", "choices": [" Lily", " dog", " car"], "gold": 0},
    {"context": "Lily loved to play in the", "choices": [" park", " moon", " soup"], "gold": 0},
    {"context": "The cat saw a big", "choices": [" dog", " ran", " the"], "gold": 0},
]
GEN_DOCS = [
    {"prompt": "Once upon a time", "answer": ", there was a little girl named Lily"},
    {"prompt": "One day, a little girl named Lily", "answer": " went to the park with her mom"},
]
MC_TASK = """task: kvmesh_stories_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
GEN_TASK = """task: kvmesh_stories_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["."]
  max_gen_toks: 12
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def replica(stories_path):
    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20, max_num_seqs=32, dtype="float32")
    runtime = ReplicaRuntime.start(config, ReplicaServerConfig(host="127.0.0.1", port=0, event_port=0, replay_port=0))
    yield runtime
    runtime.shutdown(graceful_s=1)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, docs, template in (("mc", MC_DOCS, MC_TASK), ("gen", GEN_DOCS, GEN_TASK)):
        data = d / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        (d / f"{name}.yaml").write_text(template.format(path=data))
    return d


def run_lm_eval(replica, stories_path, tasks_dir, monkeypatch, task: str) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tasks_dir / "hf_datasets_cache"))
    model_args = (f"base_url={replica.http.url}/v1/completions,model={stories_path},tokenizer={stories_path},"
                  "tokenizer_backend=huggingface,tokenized_requests=True,add_bos_token=True,"
                  "num_concurrent=1,max_retries=1,batch_size=4")
    return simple_evaluate(model="local-completions", model_args=model_args, tasks=[task],
                           task_manager=TaskManager(include_path=str(tasks_dir)), log_samples=True,
                           random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


def hf_loglikelihood(hf, tok, context: str, continuation: str) -> float:
    ctx = [tok.bos_token_id] + tok(context, add_special_tokens=False).input_ids
    whole = [tok.bos_token_id] + tok(context + continuation, add_special_tokens=False).input_ids
    assert whole[: len(ctx)] == ctx
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([whole])).logits[0].float(), dim=-1)
    return sum(logprobs[p - 1, whole[p]].item() for p in range(len(ctx), len(whole)))


def test_lm_eval_loglikelihood_task_scores_like_transformers(replica, stories_path, tasks_dir, monkeypatch):
    results = run_lm_eval(replica, stories_path, tasks_dir, monkeypatch, "kvmesh_stories_mc")
    acc = results["results"]["kvmesh_stories_mc"]["acc,none"]
    print("lm-eval kvmesh_stories_mc:", results["results"]["kvmesh_stories_mc"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(stories_path)
    samples = results["samples"]["kvmesh_stories_mc"]
    assert len(samples) == len(MC_DOCS)
    correct = 0
    for sample in samples:
        doc = sample["doc"]
        scores = [resp[0][0] for resp in sample["resps"]]  # (loglikelihood, is_greedy) per choice
        expected = [hf_loglikelihood(hf, tok, doc["context"], c) for c in doc["choices"]]
        assert scores == pytest.approx(expected, abs=1e-3)
        correct += int(max(range(len(expected)), key=expected.__getitem__) == doc["gold"])
    assert math.isclose(acc, correct / len(MC_DOCS))


def test_lm_eval_generation_task_gets_the_greedy_stories(replica, stories_path, tasks_dir, monkeypatch):
    results = run_lm_eval(replica, stories_path, tasks_dir, monkeypatch, "kvmesh_stories_gen")
    print("lm-eval kvmesh_stories_gen:", results["results"]["kvmesh_stories_gen"])
    samples = results["samples"]["kvmesh_stories_gen"]
    generations = [s["resps"][0][0] for s in samples]
    print("lm-eval generations:", generations)
    # stories260K's greedy stories (the same as transformers', tests/replica/test_engine_hf_parity.py), cut at "."
    assert generations == [doc["answer"] for doc in GEN_DOCS]
    assert results["results"]["kvmesh_stories_gen"]["exact_match,none"] == 1.0
