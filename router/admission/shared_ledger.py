"""The admission ledger in shared memory, for the router processes of one host (``router.workers`` > 1).

Fair share and rate limits must hold for a tenant whatever worker its connections land on, and the
queue bound is the host's, not each worker's. So (router/control/workers.py hands one ``SharedLedger`` to
every worker, as it hands them the ``SharedLoadTable`` of router/routing/shared_loads.py)::

    tenants   slot -> [usage, usage_at, level, level_at, has_level]   read-modify-write under one lock
              (a few microseconds per request: exact fair share and buckets across workers)
    queues    row (worker) x model slot -> [queued, best waiting priority]   one writer per cell, no lock;
              readers sum the rows (the bound may be passed by at most workers - 1 requests at once)
    waiting   model slot x tenant slot -> [waiting, owed places]   under the lock (shared_waiting.py): a queue's
              shares are the host's, and a place taken from a tenant waiting in another worker is owed there

Names map to slots through name tables in the same memory, assigned once under the lock and never
reassigned (as shared_loads.py). Tenant slot 0 is ``OVERFLOW``: tenants past ``max_tenants`` share it (they
are limited and weighed together; with a keys file the tenants are few, it is ``user`` names that are many).
Times are ``time.monotonic()``, one clock for every process of the host.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import secrets

from kvmesh.router.admission.fair_share import decayed
from kvmesh.router.admission.ledger import NO_PRIORITY
from kvmesh.router.admission.rate_limit import TokenRate, refilled, wait_for
from kvmesh.router.admission.shared_waiting import SharedWaiting

NAME_BYTES = 64
"""Bytes of a slot's name (longer names are stored as their digest)."""
OVERFLOW = "*other*"
"""The tenant slot shared by tenants past ``max_tenants``."""
_T = 5  # usage, usage_at, level, level_at, has_level
_Q = 2  # queued, best priority


class SharedLedger:
    """``TenantLedger`` (ledger.py) over shared memory; ``row``: this process's queue row (None: reader)."""

    def __init__(self, num_rows: int, half_life_s: float, max_tenants: int = 1024, max_models: int = 64,
                 context=None) -> None:
        if num_rows < 1 or max_tenants < 2 or max_models < 1:
            raise ValueError(f"need num_rows >= 1, max_tenants >= 2, max_models >= 1; got {num_rows}, "
                             f"{max_tenants}, {max_models}")
        ctx = context or mp.get_context("spawn")
        self.num_rows, self.half_life_s = num_rows, half_life_s
        self.max_tenants, self.max_models = max_tenants, max_models
        self._tenants = ctx.RawArray("d", max_tenants * _T)
        self._tenant_names = ctx.RawArray("c", max_tenants * NAME_BYTES)
        self._queues = ctx.RawArray("q", num_rows * max_models * _Q)
        self._model_names = ctx.RawArray("c", max_models * NAME_BYTES)
        self._lock = ctx.Lock()
        self._waiting = SharedWaiting(ctx, num_rows, max_models, max_tenants)
        self.row: int | None = None
        self.group = secrets.token_hex(6)
        """This host's name among a fleet's routers (router/admission/fleet_ledger.py): its workers share it."""
        self._attach()
        with self._lock:
            _claim(self._tenant_names, 0, _name(OVERFLOW))
        for i in range(num_rows * max_models):
            self._q[i * _Q + 1] = NO_PRIORITY

    def _attach(self) -> None:
        self._t = memoryview(self._tenants).cast("B").cast("d")
        self._q = memoryview(self._queues).cast("B").cast("q")
        self._tenant_slots: dict[str, int] = {}
        self._slot_names: dict[int, str] = {}
        self._model_slots: dict[str, int | None] = {}

    def __getstate__(self) -> dict:
        return {"num_rows": self.num_rows, "half_life_s": self.half_life_s, "max_tenants": self.max_tenants,
                "max_models": self.max_models, "_tenants": self._tenants, "_tenant_names": self._tenant_names,
                "_queues": self._queues, "_model_names": self._model_names, "_lock": self._lock,
                "_waiting": self._waiting, "row": self.row, "group": self.group}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    def for_row(self, row: int | None) -> SharedLedger:
        """Another view of the same memory writing ``row`` (what a worker process holds after spawn)."""
        view = object.__new__(SharedLedger)
        view.__setstate__(self.__getstate__())
        view.attach_row(row)
        return view

    def attach_row(self, row: int | None) -> None:
        """Write this process's queue lengths in ``row`` (cleared first; None: only read)."""
        self.row = row
        if row is not None:
            self.clear_row(row)

    def clear_row(self, row: int) -> None:
        """Forget a row's queues (its process exited: its waiting requests are gone)."""
        base = row * self.max_models * _Q
        for i in range(self.max_models):
            self._q[base + i * _Q] = 0
            self._q[base + i * _Q + 1] = NO_PRIORITY
        with self._lock:
            self._waiting.clear_row(row)

    # ---------------------------------------------------------------- tenants (under the lock)
    def _tenant_slot(self, tenant: str) -> int:
        slot = self._tenant_slots.get(tenant)
        if slot is None:
            slot = _find_or_claim(self._tenant_names, self.max_tenants, _name(tenant))
            slot = 0 if slot is None else slot
            if len(self._tenant_slots) >= 4 * self.max_tenants:  # many ``user`` names: the cache stays bounded
                self._tenant_slots.clear()
                self._slot_names.clear()
            self._tenant_slots[tenant] = slot
            self._slot_names[slot] = tenant
        return slot

    def usage(self, tenant: str, now: float) -> float:
        with self._lock:
            i = self._tenant_slot(tenant) * _T
            t = self._t
            return decayed(t[i], t[i + 1], now, self.half_life_s)

    def charge(self, tenant: str, weighted: float, tokens: int, limit: TokenRate | None, now: float) -> None:
        with self._lock:
            i = self._tenant_slot(tenant) * _T
            t = self._t
            t[i] = decayed(t[i], t[i + 1], now, self.half_life_s) + weighted
            t[i + 1] = now
            if limit is not None and tokens:
                level = refilled(t[i + 2], t[i + 3], now, limit) if t[i + 4] else limit.burst_tokens
                t[i + 2], t[i + 3], t[i + 4] = level - tokens, now, 1.0

    def try_take(self, tenant: str, tokens: int, limit: TokenRate, now: float) -> float:
        with self._lock:
            i = self._tenant_slot(tenant) * _T
            t = self._t
            level = refilled(t[i + 2], t[i + 3], now, limit) if t[i + 4] else limit.burst_tokens
            wait = wait_for(level, tokens, limit)
            if wait == 0.0:
                level -= tokens
            t[i + 2], t[i + 3], t[i + 4] = level, now, 1.0
            return wait

    # ---------------------------------------------------------------- queues (one writer per cell)
    def _model_slot(self, model: str) -> int | None:
        if model not in self._model_slots:
            with self._lock:
                self._model_slots[model] = _find_or_claim(self._model_names, self.max_models, _name(model))
        return self._model_slots[model]

    def publish_queue(self, model: str, queued: int, best_priority: int) -> None:
        slot = self._model_slot(model)
        if self.row is not None and slot is not None:
            i = (self.row * self.max_models + slot) * _Q
            self._q[i], self._q[i + 1] = queued, best_priority

    def queued(self, model: str) -> int:
        slot = self._model_slot(model)
        if slot is None:
            return 0
        stride = self.max_models * _Q
        return sum(self._q[row * stride + slot * _Q] for row in range(self.num_rows))

    def better_elsewhere(self, model: str, priority: int) -> bool:
        slot = self._model_slot(model)
        if slot is None:
            return False
        stride = self.max_models * _Q
        return any(self._q[row * stride + slot * _Q + 1] < priority
                   for row in range(self.num_rows) if row != self.row)

    # ---------------------------------------------------------------- each tenant's waiting (shared_waiting.py)
    def waiting_changed(self, model: str, tenant: str, delta: int, pay: bool = True) -> None:
        slot = self._model_slot(model)
        if slot is not None:
            with self._lock:
                self._waiting.change(self.row, slot, self._tenant_slot(tenant), delta, pay)

    def waiting_by_tenant(self, model: str) -> dict[str, int]:
        slot = self._model_slot(model)
        if slot is None:
            return {}
        with self._lock:
            return {self._tenant_name(t): n for t, n in self._waiting.by_tenant(slot).items()}

    def counted_as(self, tenant: str) -> str:
        with self._lock:
            return OVERFLOW if self._tenant_slot(tenant) == 0 else tenant

    def owe(self, model: str, tenant: str) -> None:
        slot = self._model_slot(model)
        if slot is not None:
            with self._lock:
                self._waiting.owe(slot, self._tenant_slot(tenant))

    def debts(self, model: str) -> dict[str, int]:
        slot = self._model_slot(model)
        if slot is None or not self._waiting.any_owed(slot):
            return {}
        with self._lock:
            return {self._tenant_name(t): n for t, n in self._waiting.owed(slot).items()}

    def pay_debt(self, model: str, tenant: str) -> bool:
        slot = self._model_slot(model)
        if slot is None:
            return False
        with self._lock:
            return self._waiting.pay(slot, self._tenant_slot(tenant))

    def _tenant_name(self, slot: int) -> str:
        """The name of tenant ``slot``: as this process saw it, else as stored (a long name: its digest)."""
        name = OVERFLOW if slot == 0 else self._slot_names.get(slot)
        if name is None:
            name = bytes(self._tenant_names[slot * NAME_BYTES:(slot + 1) * NAME_BYTES]).rstrip(b"\0").decode()
        return name


def _name(text: str) -> bytes:
    name = text.encode()
    if len(name) > NAME_BYTES or not name:
        name = b"#" + hashlib.blake2b(name, digest_size=(NAME_BYTES - 2) // 2).hexdigest().encode()
    return name


def _claim(names, slot: int, name: bytes) -> None:
    names[slot * NAME_BYTES:slot * NAME_BYTES + len(name)] = name


def _find_or_claim(names, num_slots: int, name: bytes) -> int | None:
    """The slot holding ``name``, else the first free one, claimed (call under the lock); None: full."""
    free, table = None, bytes(names)  # one copy: slicing bytes is cheaper than slicing the shared array
    for i in range(num_slots):
        held = table[i * NAME_BYTES:(i + 1) * NAME_BYTES].rstrip(b"\0")
        if held == name:
            return i
        if not held:
            free = i
            break  # slots are claimed in order and never freed: past the first free one, none is held
    if free is not None:
        _claim(names, free, name)
    return free
