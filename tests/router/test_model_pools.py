"""Several models behind one router: pools by "model", 404 / 400, the names a path answers to, /v1/models.

Pure policy (router/routing/model_pools.py, replica/serving/model_names.py, router/control/models.py's parsing);
no servers. The live test with fake replicas of two models is test_models_router_live.py.
"""

from __future__ import annotations

import os

import pytest
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.model_names import check_model, find_model, model_aliases
from kvmesh.router.control.models import served_models
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.model_pools import ModelCatalog, ServedModels
from kvmesh.router.routing.policies import NoReplicaError


def two_models(tmp_path=None) -> ModelCatalog:
    catalog = ModelCatalog()
    catalog.set_served(Replica("a1", healthy=True), ServedModels("llama", "/models/llama"))
    catalog.set_served(Replica("a2", healthy=True), ServedModels("llama", "/models/llama", {"tiny": "/adapters/tiny"}))
    catalog.set_served(Replica("b1", healthy=True), ServedModels("qwen", "/models/qwen"))
    return catalog


def test_each_base_model_picks_its_own_replicas():
    catalog = two_models()
    assert catalog.bases() == ["llama", "qwen"]
    llama, qwen = catalog.pool("llama"), catalog.pool("qwen")
    assert (llama.base, llama.replicas, llama.lora_name) == ("llama", {"a1", "a2"}, None)
    assert (qwen.base, qwen.replicas) == ("qwen", {"b1"})
    assert catalog.pool("/models/qwen").replicas == {"b1"}  # the root it reported answers too


def test_an_unknown_model_is_a_404_and_no_model_a_400_naming_model_when_several_are_served():
    catalog = two_models()
    with pytest.raises(ProtocolError) as e:
        catalog.pool("gpt-4")
    assert e.value.status_code == 404 and e.value.param == "model"
    assert "The model `gpt-4` does not exist" in str(e.value) and "llama, qwen" in str(e.value)
    with pytest.raises(ProtocolError) as e:
        catalog.pool(None)
    assert e.value.status_code == 400 and "`model`" in str(e.value)


def test_one_base_model_keeps_todays_rule_every_replica_and_any_name():
    catalog = ModelCatalog()
    catalog.set_served(Replica("a1", healthy=True), ServedModels("llama", None))
    catalog.set_served(Replica("a2", healthy=True), ServedModels("llama", None))
    assert catalog.pool(None) is None and catalog.pool("llama") is None
    assert catalog.pool("whatever") is None  # the router's own served_model_name rule decides (models.py)


def test_an_adapter_pool_is_its_holders_and_the_replicas_of_its_base_that_can_load_it():
    catalog = two_models()
    tiny = catalog.pool("tiny")
    assert (tiny.model, tiny.base, tiny.lora_name, tiny.lora_path) == ("tiny", "llama", "tiny", "/adapters/tiny")
    assert tiny.holders == {"a2"} and tiny.replicas == {"a1", "a2"}  # never b1: another base
    no_loads = ModelCatalog(load_missing_adapters=False)
    for rid, served in two_models().served.items():
        no_loads.set_served(Replica(rid, healthy=True), served)
    assert no_loads.pool("tiny").replicas == {"a2"}


def test_an_adapter_learned_from_the_admin_is_loadable_on_its_base_and_forgotten_on_unload():
    catalog = two_models()
    catalog.learn_adapter("sql", "/adapters/sql", "qwen")
    sql = catalog.pool("sql")
    assert (sql.base, sql.replicas, sql.holders) == ("qwen", {"b1"}, frozenset())
    catalog.forget_adapter("sql")
    with pytest.raises(ProtocolError):
        catalog.pool("sql")


def test_load_reports_keep_known_adapter_paths_and_say_when_one_is_unknown():
    catalog = two_models()
    assert catalog.set_adapters(catalog.replicas.get("a2"), ["tiny"]) is False
    assert catalog.set_adapters(catalog.replicas.get("a1"),
                                ["tiny", "other"]) is True  # "other": its path is in the replica's /v1/models
    assert catalog.served["a1"].adapters == {"tiny": "/adapters/tiny", "other": None}
    assert catalog.pool("other").replicas == {"a1"}  # no path: only its holder serves it


def test_a_replica_that_leaves_takes_its_model_with_it():
    catalog = two_models()
    catalog.replicas.remove("b1")
    assert catalog.bases() == ["llama"]
    assert catalog.pool("qwen") is None  # one base model again: today's rule


def test_the_kv_router_routes_only_inside_the_pool():
    router = KVRouter(block_size=4)
    for rid in ("a1", "a2", "b1"):
        router.add_replica(rid)
    prompt = list(range(12))
    for _ in range(6):
        decision = router.route(prompt, pool=frozenset({"b1"}))
        assert decision.replica_id == "b1" and decision.pool == {"b1"}
    router.set_healthy(router.replicas.get("b1"), False)
    with pytest.raises(NoReplicaError, match="serves this model"):
        router.route(prompt, pool=frozenset({"b1"}))


def test_served_models_reads_vllms_model_list():
    body = (b'{"object":"list","data":[{"id":"llama","root":"/m/llama","object":"model"},'
            b'{"id":"tiny","root":"/a/tiny","parent":"llama","object":"model"}]}')
    served = served_models(body)
    assert (served.base, served.root, served.adapters) == ("llama", "/m/llama", {"tiny": "/a/tiny"})
    assert served_models(b"not json") is None and served_models(b'{"data": []}') is None


def test_a_model_path_answers_to_its_given_absolute_and_resolved_forms(tmp_path, monkeypatch):
    """A path through a symbolic link used to get 404 (tests/replica/test_server_cli.py on a machine where
    ../shared is a link). One rule: the path as given, its absolute and its resolved form."""
    real = tmp_path / "real" / "models" / "tiny"
    real.mkdir(parents=True)
    (tmp_path / "shared").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path / "shared" / "models")  # the cwd resolves: abspath goes through real/
    aliases = model_aliases("tiny", os.path.abspath("tiny"))
    assert aliases[0] == "tiny" and str(real) in aliases
    through_link = str(tmp_path / "shared" / "models" / "tiny")
    for name in ("tiny", "./tiny", str(real), through_link,
                 str(tmp_path / "shared" / "models" / ".." / "models" / "tiny")):
        check_model(name, "tiny", aliases)  # no 404
        assert find_model(name, aliases) is not None
    with pytest.raises(ProtocolError) as e:
        check_model(str(tmp_path / "real" / "models"), "tiny", aliases)
    assert e.value.status_code == 404
    check_model("tiny", "tiny", ())  # a name without aliases
    with pytest.raises(ProtocolError):
        check_model("a/b\0c", "tiny", aliases)  # a name no filesystem call takes: refused, not a crash


def test_a_catalog_base_given_as_a_path_answers_through_a_link(tmp_path):
    (tmp_path / "real" / "llama").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    catalog = two_models()
    catalog.set_served(Replica("c1", healthy=True), ServedModels("mistral", str(tmp_path / "real" / "llama")))
    assert catalog.pool(str(tmp_path / "link" / "llama")).replicas == {"c1"}


class _Tok:
    fingerprint = "ours"


def _models(**tokenize):
    """A router's ``RouterModels`` whose own model is llama (its tokenizer ``_Tok``)."""
    from kvmesh.router.config import RouterConfig, TokenizeConfig
    from kvmesh.router.control.models import RouterModels
    from kvmesh.router.replicas.replica_set import ReplicaSet

    config = RouterConfig(model="/models/llama", served_model_name="llama", tokenize=TokenizeConfig(**tokenize))
    return RouterModels(config, ReplicaSet(), _Tok(), object(), None)


def test_each_base_model_gets_its_tokenizer_from_the_first_rule_that_names_one(tmp_path):
    models = _models(tokenizers={"qwen": "Qwen/Qwen2.5-0.5B"})
    path = models.tokenizer_path
    assert path(ServedModels("llama", "/elsewhere"), None) is None  # the router's own model: its own tokenizer
    assert path(ServedModels("other", "/models/llama"), None) is None  # ... by any name of its path
    assert path(ServedModels("qwen", str(tmp_path)), None) == "Qwen/Qwen2.5-0.5B"  # named in tokenize.tokenizers
    assert path(ServedModels("same", str(tmp_path)), {"tokenizer_fingerprint": "ours"}) is None  # same tokenizer
    assert path(ServedModels("mistral", str(tmp_path)), {"tokenizer_fingerprint": "theirs"}) == str(tmp_path)
    assert path(ServedModels("remote", "/not/on/this/host"), None) is None  # nothing to load: the router's own
    assert _models(load_reported_tokenizers=False).tokenizer_path(
        ServedModels("mistral", str(tmp_path)), None) is None
