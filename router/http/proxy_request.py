"""One proxied request, the one object that carries it from the router's socket to its upstream call.

What the client sent (``body``: its JSON object, decoded once; ``req``: that object validated), what the router
made of it (the prompts' token ids, the sampling parameters, the session and receipt asks, the granted priority,
the KV parameters) and, per kind of upstream, the body that upstream gets: the client's object with what the
router decided set on it, encoded once (``for_kind``; tokenize once: router/http/token_forwarding.py). A stream
also carries its ``MigratingStream`` (router/http/migration.py); a continuation on another replica is a
``ProxyRequest`` of its own (``continuation``).

Rewriting is exact: a replica range-checks token ids and uses them as they are, and the router computed
them with the replica's own rules (replica/serving/tokenizer.py). ``echo`` is excluded because the echoed
text must be the client's own; a batch of prompts is rewritten only as a whole. Every other field of the body,
those the router does not know included, goes as sent (``cache_salt``, sampling parameters, ``stream``,
``return_token_ids``), but ``priority``: a replica that schedules by priority gets the one the router granted
(router/http/caller.py), any other none. A client's duplicate keys were settled when its body was decoded
(the last wins, as in the replica's decoder); the body sent has each key once.
"""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.openai.body import encode_off_loop
from kvmesh.replica.openai.compile_tenant import tenant_header
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.router.http.token_forwarding import KVMESH, TEXT, VLLM, VLLM_TOKENIZING_KEYS, UpstreamKind

if TYPE_CHECKING:
    from kvmesh.replica.openai.body import Offload
    from kvmesh.replica.openai.protocol import ChatCompletionRequest
    from kvmesh.replica.serving.json_types import JSONObject
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.router.admission.tenants import Tenant
    from kvmesh.router.http.migration import MigratingStream
    from kvmesh.router.routing.kv_router import KVRouter, RouteDecision
    from kvmesh.router.routing.model_pools import ModelPool

    OpenAIRequest = CompletionRequest | ChatCompletionRequest


@dataclass(eq=False)
class ProxyRequest:
    """One request through the proxy (see the module doc): each upstream body is encoded once, when it is sent."""

    body: JSONObject
    """The JSON object the client sent, decoded once: every field, those the router does not know too (plus
    ``return_token_ids`` for a stream the router may migrate; a prompt of token ids as its bytes, ``msgspec.Raw``:
    replica/openai/body.py); a continuation's, the router's own."""
    req: OpenAIRequest | None = None
    """``body`` validated (None for a continuation, whose body the router wrote)."""
    prompts: list[list[int]] = field(default_factory=list)
    """Token ids the router computed, one list per prompt (empty: none, e.g. no tokenizer)."""
    chat: bool = False
    """A chat completion (else a completion)."""
    forward_ids: bool = False
    """Upstreams that take them get the router's token ids (``RouterConfig.tokenize.forward_token_ids``; never
    without ids)."""
    _: KW_ONLY
    path: str = "/v1/completions"
    """The path it goes to upstream."""
    size: int = 0
    """Bytes of the body the client sent: a large one's upstream bodies are encoded off the loop, as it was
    decoded (``encoded_for``)."""
    session_id: str | None = None
    """``x-session-id`` or the body's ``user``: soft affinity to the replica of the last turn."""
    wants_receipt: bool = False
    """The client asked for the route receipt's headers (``x-kvmesh-receipt: 1``)."""
    tokenize_ns: int | None = None
    """Time spent validating and tokenizing it (None: not observed, e.g. a continuation)."""
    sampling_params: SamplingParams | None = None
    """The first prompt's sampling parameters, validated at the edge against its length and the context."""
    stream: MigratingStream | None = None
    """A stream's state: what went out, and how to continue it elsewhere (None: not a stream)."""
    model_pool: ModelPool | None = None
    """The replicas its ``"model"`` may go to and the adapter it selects (router/routing/model_pools.py); None:
    every replica, no adapter."""
    tenant: Tenant | None = None
    """Whose it is, by its credentials (router/http/caller.py; None: a continuation, admitted as its stream)."""
    priority: int | None = None
    """The priority the router granted it: what every leg to a replica that schedules by priority carries
    (None: none granted, such a replica gets 0)."""
    kv_transfer_params: dict | None = field(init=False, default=None)
    """What the router adds for the replica it goes to (router/http/kv_handoff.py: a prefill replica's handle, a
    peer to pull from); None: the body goes without."""
    compile_tokens: float = field(init=False, default=0.0)
    """Its replicas' grammar compile seconds as prompt tokens (router/http/compile_charge.py): its tenant's share."""
    failed_over: list[str] = field(init=False, default_factory=list)
    """Replicas it left before the one answering, each with why: the route receipt's ``failed_over``."""
    salt: str | None = field(init=False)
    """``cache_salt``: the router's keys of this request are salted with it, as the replica's."""
    route_ids: list[int] = field(init=False)
    """The token ids it is routed by (a batch of prompts goes to one replica, by its first)."""

    def __post_init__(self) -> None:
        self.prompts = self.prompts or []
        self.salt = self.req.cache_salt if self.req is not None else None
        self.route_ids = self.prompts[0] if self.prompts else []
        self.forward_ids = self.forward_ids and bool(self.prompts)

    @classmethod
    def continuation(cls, body: dict[str, object], route_ids: list[int], salt: str | None,
                     model_pool: ModelPool | None = None, priority: int | None = None) -> ProxyRequest:
        """A stream's continuation on another replica (of its model's pool): a token-in completion the router
        wrote itself, at the stream's granted ``priority``."""
        request = cls(body, model_pool=model_pool, priority=priority)
        request.route_ids, request.salt = route_ids, salt
        return request

    def route(self, router: KVRouter, tried: list[str], commit: bool = True,
              within: frozenset | None = None) -> RouteDecision:
        """Where it goes, avoiding ``tried`` and among ``within`` when given (NoReplicaError: nowhere): dispatch's
        call, and admission's for the head of its queue (router/http/admission_gate.py: ``commit=False`` until it
        goes, ``within`` the idle replicas instead of a busy one; ``KVRouter.route``)."""
        pool = self.model_pool
        if pool is None:
            decision = router.route(self.route_ids, self.salt, exclude=tried, session_id=self.session_id,
                                    commit=commit, pool=within)
        else:
            decision = router.route(self.route_ids, self.salt, pool.lora_name, exclude=tried,
                                    session_id=self.session_id,
                                    pool=pool.replicas if within is None else pool.replicas & within, commit=commit,
                                    lora_identity=pool.lora_identity)
        decision.sequences = self.sequences()
        return decision

    def sequences(self) -> int:
        """Sequences it runs on a replica: a chat's ``n``, a completion's prompts x the larger of ``n`` and
        ``best_of`` (1 for a continuation, one choice's stream)."""
        req = self.req
        if isinstance(req, CompletionRequest):
            return len(req.prompts()) * max(req.n, req.best_of or 1)
        return 1 if req is None else req.n

    def headers(self) -> dict[str, str]:
        """Its own headers to a replica: the tenant its grammar compiles are charged to, its key's (never a ``user``
        sub-tenant: replica/openai/compile_tenant.py); none for a continuation (its replica goes by ``user``)."""
        return {} if self.tenant is None else tenant_header(self.tenant.bucket)

    def ask_for_token_ids(self) -> None:
        """Streams: ask every upstream for the token ids behind the text (a stream migrates by them,
        router/http/migration.py)."""
        self.body["return_token_ids"] = True

    def forwards_ids(self, kind: UpstreamKind) -> bool:
        """Whether an upstream of ``kind`` gets the router's token ids for this request."""
        req = self.req
        if not self.forward_ids or kind == TEXT or req is None:
            return False
        if self.chat:  # a client may not send a chat's ids (router_only.py): the router's always go
            return kind == KVMESH
        if req.echo:
            return False  # the echoed prompt must be the client's text, not the ids decoded
        if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
            return False  # already token ids
        return kind != VLLM or VLLM_TOKENIZING_KEYS.isdisjoint(self.body)  # vLLM would tokenize it otherwise

    def for_kind(self, kind: UpstreamKind, by_priority: bool = False) -> bytes:
        """The body an upstream of ``kind`` gets, encoded once (``fields_for``)."""
        return msgspec.json.encode(self.fields_for(kind, by_priority))

    async def encoded_for(self, kind: UpstreamKind, by_priority: bool, offload: Offload) -> bytes:
        """``for_kind``, through ``offload`` (``PromptRenderer.run``) for a large body, so the loop stays free."""
        return await encode_off_loop(self.fields_for(kind, by_priority), self.size, offload)

    def fields_for(self, kind: UpstreamKind, by_priority: bool = False) -> JSONObject:
        """The JSON object an upstream of ``kind`` gets: the client's fields with what the router decided set on
        them (its token ids where ``kind`` takes them, ``kv_transfer_params`` when the router set them);
        ``by_priority`` (it schedules by priority), with the granted priority; else with no priority at all."""
        body = dict(self.body)
        if self.forwards_ids(kind):
            if self.chat:
                body["prompt_token_ids"] = self.prompts[0]
            else:  # one prompt stays one; a batch becomes a batch of id lists, in order
                prompt = body["prompt"]
                single = not (isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int))
                assert len(self.prompts) == (1 if single else len(prompt)), "one id list per prompt"
                body["prompt"] = self.prompts[0] if single else self.prompts
        if by_priority:
            body["priority"] = self.priority or 0
        else:
            body.pop("priority", None)
        if self.kv_transfer_params is not None:
            body["kv_transfer_params"] = self.kv_transfer_params
        return body

