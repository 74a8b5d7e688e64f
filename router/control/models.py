"""The router's models: what each replica serves, the pool a request picks, and a tokenizer per base model.

``RouterModels`` reads each replica's ``/v1/models`` when it becomes healthy (vLLM's shape: the base model's
entry, and one per adapter with its ``parent``) and the adapter names of every ``/load``'s ``lora`` section,
into a ``ModelCatalog`` (router/routing/model_pools.py), which picks each request's pool. It tokenizes each base
model's requests with that model's tokenizer (tokenize once, forwarded per model: a replica's upstream kind and
its fingerprint check use the tokenizer of the model it serves):

    the router's own model (``model`` / ``served_model_name`` / ``tokenizer``, any of their path forms)
                                              the router's tokenizer, as before
    named in ``tokenize.tokenizers``          that tokenizer
    reports the router's tokenizer fingerprint  the router's tokenizer
    reports a path that is a directory here   loaded from it (``tokenize.load_reported_tokenizers``)
    otherwise                                 the router's tokenizer (a mismatch shows in the fingerprint check:
                                              that replica gets text and is routed by load only)

A tokenizer that fails to load leaves its model's requests untokenized: routed by load, sent as given.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.openai.responses import ModelCard
from kvmesh.replica.serving.model_names import check_model, model_aliases, names_model
from kvmesh.router.http.upstream import UpstreamError
from kvmesh.router.routing.model_pools import ModelCatalog, ModelPool, ServedModels

if TYPE_CHECKING:
    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.replica.serving.tokenizer import Tokenizer
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.http.token_forwarding import ServerInfo
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.replicas.replica_set import ReplicaSet

logger = logging.getLogger(__name__)

Frontend = tuple["Tokenizer | None", PromptRenderer]
"""A base model's tokenizer (None: its requests are routed untokenized) and the renderer over it."""


def build_tokenizer(path: str, config: RouterConfig, max_model_len: int | None) -> Tokenizer:
    """A tokenizer the router renders requests with (its tokenize cache on, when configured)."""
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path, max_model_len=max_model_len, chat_template=config.frontend.chat_template)
    if config.tokenize.tokenize_cache_tokens and hasattr(tokenizer, "hf"):
        from kvmesh.router.routing.tokenize_cache import CachedTokenizer

        # Same ids, pieces between added tokens seen before come from a cache (router/routing/tokenize_cache.py).
        tokenizer.cache = CachedTokenizer(tokenizer.hf, config.tokenize.tokenize_cache_tokens)
    return tokenizer


def router_tokenizer(config: RouterConfig, tokenizer: Tokenizer | None) -> Tokenizer | None:
    """The router's own tokenizer: ``tokenizer``, else the configured one (None: none configured), with its
    tokenize cache when configured."""
    if tokenizer is None and (config.tokenizer or config.model):
        return build_tokenizer(config.tokenizer or config.model, config, config.max_model_len)
    if tokenizer is not None and config.tokenize.tokenize_cache_tokens and hasattr(tokenizer, "hf"):
        from kvmesh.router.routing.tokenize_cache import CachedTokenizer

        tokenizer.cache = CachedTokenizer(tokenizer.hf, config.tokenize.tokenize_cache_tokens)  # as build_tokenizer
    return tokenizer


def served_models(raw: bytes) -> ServedModels | None:
    """A ``/v1/models`` body (vLLM's list) as ``ServedModels``; None when it names no base model."""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    cards = [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
    bases = [card for card in cards if not card.get("parent")]
    if not bases:
        return None
    root = bases[0].get("root")
    adapters = {card["id"]: card.get("root") if isinstance(card.get("root"), str) else None
                for card in cards if card.get("parent") == bases[0]["id"]}
    return ServedModels(bases[0]["id"], root if isinstance(root, str) else None, adapters)


class RouterModels:
    """See the module doc."""

    def __init__(self, config: RouterConfig, replicas: ReplicaSet, tokenizer: Tokenizer | None,
                 renderer: PromptRenderer, calls: ReplicaCalls) -> None:
        """``replicas``: the router's set (each record holds what it serves); ``tokenizer`` and ``renderer``: the
        router's own; ``calls``: its client of control calls."""
        self.config, self.tokenizer, self.renderer, self.calls = config, tokenizer, renderer, calls
        cfg = config
        self.replicas = replicas
        self.catalog = ModelCatalog(cfg.upstream.load_missing_adapters, self.replicas)
        """What each replica serves (router/routing/model_pools.py)."""
        self.own_names = model_aliases(*cfg.served_names(), cfg.model, cfg.tokenizer)
        """Every name of the router's own model (its path forms too)."""
        self.frontends: dict[str, Frontend] = {}
        """Base model -> its tokenizer and renderer (the router's own for its own model)."""
        self._loading: dict[str, asyncio.Task] = {}

    # ---------------------------------------------------------------- requests
    def check_own(self, model: str | None) -> None:
        """Today's rule of a one-model router: a 404 for a name other than ``served_model_name`` (or a path form
        of ``model``); no ``served_model_name``: any name (the replica checks it)."""
        served = self.config.served_name
        if served is not None:
            check_model(model, served, aliases=self.own_names)

    def pool_for(self, model: str | None) -> ModelPool | None:
        """The pool ``model`` picks (None: every replica); ProtocolError 400/404 as ``ModelCatalog.pool``."""
        pool = self.catalog.pool(model)
        if pool is None and model is not None and self.config.served_name is not None \
                and not self.catalog.names_base(model):
            self.check_own(model)  # one base model (else pool() refused an unknown name): today's rule
        return pool

    def frontend(self, pool: ModelPool | None) -> Frontend:
        """The tokenizer and renderer of the pool's base model (the router's own without a pool)."""
        own = (self.tokenizer, self.renderer)
        return own if pool is None else self.frontends.get(pool.base, own)

    def tokenizer_of(self, replica: Replica) -> Tokenizer | None:
        """The tokenizer of the model ``replica`` serves (its upstream kind and fingerprint check use it)."""
        base = self.catalog.base_of(replica)
        return self.tokenizer if base is None else self.frontends.get(
            base, (self.tokenizer, None))[0]

    def cards(self, paths: bool = False) -> list[dict]:
        """``/v1/models``'s entries in vLLM's shape: every base model served, then every adapter (``parent``: its
        base); ``root`` is the host path or hub id it was loaded from only with ``paths`` (the admin), else its
        served name; ``max_model_len`` is its tokenizer's context (None before the router knows it)."""
        bases, cfg = self.catalog.bases(), self.config
        own = cfg.served_name or cfg.model or cfg.tokenizer
        if len(bases) <= 1 and (own is not None or not bases):  # one model: as before, under the router's name
            base_cards = [(own or "kvmesh", cfg.model, None, self._context(None))]
        else:
            base_cards = [(base, self.catalog.root_of(base), None, self._context(base)) for base in bases]
        parent_of_one = base_cards[0][0] if len(base_cards) == 1 else None
        adapters = [(name, path, parent_of_one if len(bases) <= 1 else base,
                     self._context(None if len(bases) <= 1 else base))
                    for name, (base, path) in sorted(self.catalog.adapters().items())]
        return [ModelCard(id=name, root=root if paths else name, parent=parent, max_model_len=context).model_dump()
                for name, root, parent, context in base_cards + adapters]

    def _context(self, base: str | None) -> int | None:
        """The context length of ``base`` (None: the router's own model), from its tokenizer."""
        tokenizer = self.tokenizer if base is None else self.frontends.get(
            base, (self.tokenizer, None))[0]
        return tokenizer.max_model_len if tokenizer is not None else None

    # ---------------------------------------------------------------- reports
    async def learn(self, replica: Replica, info: ServerInfo | None) -> None:
        """Read what ``replica`` serves (its ``/v1/models``) and make its base model's tokenizer ready."""
        spec = replica.spec
        try:
            status, _, raw = await self.calls.control.fetch("GET", spec.url, "/v1/models",
                                                        self.config.upstream.connect_timeout_s,
                                                        headers=self.calls.headers())
        except (UpstreamError, OSError, asyncio.TimeoutError):
            return
        served = served_models(raw) if status == 200 else None
        if served is None or replica.removed or replica.spec is not spec:
            return
        self.catalog.set_served(replica, served)
        lora = replica.load.lora  # its last /load's adapters and their identities, which /v1/models does not carry:
        if lora is not None and lora.enabled:  # without them its adapters' requests match none of its blocks
            self.catalog.set_adapters(replica, lora.adapters, lora.identities)
        await self._frontend_ready(served, info)

    def on_load(self, replica: Replica, report: LoadReport) -> None:
        """A ``/load`` report: the adapters the replica has now (its ``lora`` section, when LoRA is on); one
        whose path the router does not know yet is read from its ``/v1/models`` (e.g. another router loaded it)."""
        if not report.lora.enabled or not self.catalog.set_adapters(replica, report.lora.adapters,
                                                                      report.lora.identities):
            return
        names = frozenset(report.lora.adapters)
        if not replica.removed and replica.adapters_asked != names:  # once per set of adapters, not every poll
            replica.adapters_asked = names
            asyncio.ensure_future(self.learn(replica, None))

    async def _frontend_ready(self, served: ServedModels, info: ServerInfo | None) -> None:
        base = served.base
        if base in self.frontends:
            return
        task = self._loading.get(base)
        if task is None:
            task = self._loading[base] = asyncio.ensure_future(self._make_frontend(served, info))
        try:
            self.frontends[base] = await asyncio.shield(task)
        finally:
            self._loading.pop(base, None)

    async def _make_frontend(self, served: ServedModels, info: ServerInfo | None) -> Frontend:
        own = (self.tokenizer, self.renderer)
        path = self.tokenizer_path(served, info)
        if path is None:
            return own
        try:
            tokenizer = await asyncio.to_thread(build_tokenizer, path, self.config, None)
        except Exception as e:  # noqa: BLE001 - any loader failure: that model's requests go untokenized
            logger.warning("model %s: its tokenizer %s did not load (%s); its requests are routed by load only",
                           served.base, path, e)
            tokenizer = None
        logger.info("model %s: tokenizer %s", served.base, path)
        return tokenizer, PromptRenderer(tokenizer, self.config.frontend)

    def tokenizer_path(self, served: ServedModels, info: ServerInfo | None) -> str | None:
        """Where a base model's tokenizer loads from (module doc's table); None: the router's own."""
        cfg = self.config.tokenize
        if names_model(served.base, self.own_names) or (served.root and names_model(served.root, self.own_names)):
            return None
        if served.base in cfg.tokenizers:
            return cfg.tokenizers[served.base]
        fingerprint = info.get("tokenizer_fingerprint") if isinstance(info, dict) else None
        if self.tokenizer is not None and fingerprint == self.tokenizer.fingerprint:
            return None
        if cfg.load_reported_tokenizers and served.root and os.path.isdir(served.root):
            return served.root
        return None

    def close(self) -> None:
        own = self.renderer
        for _, renderer in self.frontends.values():
            if renderer is not own:
                renderer.close()
