"""Several models behind one router: what each replica serves, and the pool a request's ``"model"`` picks.

Each replica reports what it serves (router/control/models.py reads its ``/v1/models``, vLLM's shape, and the
adapter names of its ``/load``'s ``lora`` section): one base model (its served name and ``root``, the path or hub
id it was loaded from) and the LoRA adapters it has (name -> path). ``ModelCatalog`` keeps those reports and
answers, for a request's ``"model"``, its ``ModelPool``: the replicas that may serve it.

    "model"                       pool
    a base model (or its alias)   the replicas serving that base
    an adapter                    the replicas holding it, and those of its base when its path is known (the
                                  router loads it there first: router/control/adapter_loads.py)
    none                          every replica while one base model is served; with several, a 400 naming `model`
    an unknown name               with several base models a 404 (vLLM's); with one, today's rule (the router's
                                  ``served_model_name`` decides, the replica checks the rest)

While one base model is served the pool of a base-model request is None (every replica, whatever it
reported): a single-model router routes exactly as before. Names of a base given as a path follow the one naming
rule (replica/serving/model_names.py): the path as given, its absolute and its resolved form. The pool's
``model`` is the name as the request gave it: admission queues per model by it. An adapter's ``lora_identity`` is
the identity of its weights its holders report (``/load``'s ``lora.identities``; the most reported while a reload
is under way): the router keys the adapter's requests with it, as the replicas key its blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.model_names import find_model, model_aliases
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.replicas.served import ServedModels


class AdapterLoadError(Exception):
    """A replica did not load a LoRA adapter the router asked it to (its reason in the message)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The replica's HTTP status when it answered with a refusal (e.g. 400 for weights it cannot serve)."""


@dataclass(frozen=True, slots=True)
class ModelPool:
    """The replicas a request's ``"model"`` may go to."""

    model: str
    """The name as the request gave it (admission's queue key)."""
    base: str
    """The base model's served name (its tokenizer tokenizes the request)."""
    replicas: frozenset
    """Candidates: replicas of the base, or holding the adapter (or able to load it)."""
    lora_name: str | None = None
    """The adapter the request selects (its blocks are keyed with it, as the engine keys them); None: the base."""
    holders: frozenset = frozenset()
    """Replicas that have the adapter now (a request routed elsewhere loads it there first)."""
    lora_path: str | None = None
    """Where the adapter loads from (None: only its holders can serve it)."""
    lora_identity: str | None = None
    """The identity of the adapter's weights its holders report (it keys the request's blocks after the name)."""


class ModelCatalog:
    """The replicas' reports and the adapters the router learned (see the module doc). No I/O."""

    def __init__(self, load_missing_adapters: bool = True, replicas: ReplicaSet | None = None) -> None:
        """``replicas``: the router's set, whose records hold what each replica serves (``Replica.served``); None: a
        set of its own, where a replica is registered when it first reports."""
        self.load_missing_adapters = load_missing_adapters
        """Adapter pools include the base's replicas that lack the adapter (the router loads it there first)."""
        self._adds = replicas is None
        self.replicas = ReplicaSet() if replicas is None else replicas
        self.adapter_paths: dict[str, tuple[str, str | None]] = {}
        """Adapter -> (path, base) learned from reports and ``POST /v1/load_lora_adapter`` (base None: any)."""
        self._aliases: dict[str, str] = {}
        """Every name of every base (model_aliases) -> the base's served name."""
        self._roots: dict[str, str | None] = {}
        """Base served name -> its root as first reported."""

    # ---------------------------------------------------------------- reports
    def set_served(self, replica: Replica, served: ServedModels) -> None:
        """What ``replica`` serves now (its ``/v1/models``; a replica removed meanwhile: nothing). The identities its
        ``/load`` reported stay for the adapters it still serves: ``/v1/models`` carries none, and without them their
        requests would match no block anywhere until its next ``/load``."""
        if self._adds:  # a set of its own: registered when first reported (the record there kept)
            replica = self.replicas.add(replica)
        if replica.removed:
            return
        if replica.served is not None and not served.identities:
            served.identities = {name: ident for name, ident in replica.served.identities.items()
                                 if name in served.adapters}
        replica.served = served
        if served.base not in self._roots:
            self._roots[served.base] = served.root
            for alias in model_aliases(served.base, served.root):
                self._aliases.setdefault(alias, served.base)
        for name, path in served.adapters.items():
            if path is not None:
                self.adapter_paths[name] = (path, served.base)

    def set_adapters(self, replica: Replica, names: Iterable[str],
                     identities: Mapping[str, str] | None = None) -> bool:
        """The adapters ``replica`` has now (``/load``'s ``lora.adapters``, and the identities of their weights):
        paths already known are kept. True when one of them has no known path (its ``/v1/models`` says it)."""
        served = replica.served
        if served is None:
            return False
        names = list(names)
        served.identities = {name: ident for name, ident in (identities or {}).items() if name in names}
        if set(names) != set(served.adapters):
            served.adapters = {name: served.adapters.get(name) or self.path_of(name) for name in names}
        return any(path is None for path in served.adapters.values())

    @staticmethod
    def add_adapter(replica: Replica, name: str, path: str | None) -> None:
        """``replica`` loaded ``name`` (the router's load call succeeded)."""
        served = replica.served
        if served is not None:
            served.adapters[name] = path

    def learn_adapter(self, name: str, path: str, base: str | None) -> None:
        """An adapter the router may load on the replicas of ``base`` (None: of the only base)."""
        self.adapter_paths[name] = (path, base)

    def forget_adapter(self, name: str) -> None:
        """Unloaded: no replica is asked to load it again, and holders drop it."""
        self.adapter_paths.pop(name, None)
        for served in self.served.values():
            served.adapters.pop(name, None)
            served.identities.pop(name, None)

    @property
    def served(self) -> dict[ReplicaId, ServedModels]:
        """Replica id -> what it reported (read from the records)."""
        return {r.id: r.served for r in self.replicas if r.served is not None}

    # ---------------------------------------------------------------- reading
    def identity_of(self, adapter: str, holders: Iterable[ReplicaId]) -> str | None:
        """The identity of ``adapter``'s weights most of ``holders`` report (None: none reported)."""
        counts = Counter(ident for rid in holders if (ident := self.served[rid].identities.get(adapter)))
        return max(sorted(counts), key=counts.__getitem__) if counts else None

    def base_holding(self, adapter: str) -> str | None:
        """The base model adapter name ``adapter`` belongs to here (None: no such adapter, or its base unknown)."""
        return self.adapters().get(adapter, (None, None))[0]

    def path_of(self, adapter: str) -> str | None:
        known = self.adapter_paths.get(adapter)
        return known[0] if known is not None else None

    def bases(self) -> list[str]:
        """The base models served now, in the order first seen."""
        live = {r.served.base for r in self.replicas if r.served is not None}
        return [base for base in self._roots if base in live]

    @staticmethod
    def base_of(replica: Replica) -> str | None:
        served = replica.served
        return served.base if served is not None else None

    @staticmethod
    def adapters_of(replica: Replica) -> list[str]:
        served = replica.served
        return list(served.adapters) if served is not None else []

    def root_of(self, base: str) -> str | None:
        return self._roots.get(base)

    def replicas_of(self, base: str) -> frozenset:
        return frozenset(rid for rid, s in self.served.items() if s.base == base)

    def adapters(self) -> dict[str, tuple[str | None, str | None]]:
        """Every adapter served or loadable -> (its base, its path)."""
        out: dict[str, tuple[str | None, str | None]] = {}
        for name, (path, base) in self.adapter_paths.items():
            out[name] = (base, path)
        for served in self.served.values():
            for name, path in served.adapters.items():
                if name not in out or out[name][0] is None:
                    out[name] = (served.base, path or self.path_of(name))
        bases = self.bases()
        return {name: (base if base is not None or len(bases) != 1 else bases[0], path)
                for name, (base, path) in out.items()}

    def names_base(self, model: str) -> bool:
        """Whether ``model`` names a base model served now (its served name or a form of its root)."""
        alias = find_model(model, self._aliases)
        return alias is not None and self._aliases[alias] in self.bases()

    def pool(self, model: str | None) -> ModelPool | None:
        """The pool ``model`` picks (module doc); None: every replica (one base model served, or a name the
        catalog does not know while one is: the caller applies the router's own rule). Raises ProtocolError:
        400 without ``model`` while several base models are served, 404 for an unknown one then."""
        bases = self.bases()
        if model is None:
            if len(bases) > 1:
                raise ProtocolError(f"this router serves several models ({', '.join(bases)}): name one in `model` "
                                    "(GET /v1/models lists them)", 400, param="model")
            return None
        alias = find_model(model, self._aliases)
        if alias is not None and self._aliases[alias] in bases:
            return None if len(bases) == 1 else ModelPool(model, self._aliases[alias],
                                                          self.replicas_of(self._aliases[alias]))
        holders = frozenset(rid for rid, s in self.served.items() if model in s.adapters)
        known = self.adapter_paths.get(model)
        if holders or known is not None:
            path, base = known if known is not None else (None, None)
            if base is None:
                base = self.served[next(iter(holders))].base if holders else bases[0] if len(bases) == 1 else None
            path = path or next((p for rid in holders if (p := self.served[rid].adapters[model])), None)
            loadable = self.replicas_of(base) if base is not None and path and self.load_missing_adapters \
                else frozenset()
            if holders or loadable:
                return ModelPool(model, base, holders | loadable, model, holders, path,
                                 self.identity_of(model, holders))
        if len(bases) > 1:
            raise ProtocolError(f"The model `{echo(model)}` does not exist; this router serves {', '.join(bases)} and "
                                "their adapters (see /v1/models).", 404, param="model")
        return None
