"""Each tenant's waiting requests and owed places per model, in shared memory (the part of ``SharedLedger`` that
queue shares read: router/admission/queue_share.py).

    waiting   model slot x tenant slot -> [waiting, owed]      every process's, under the ledger's lock
    rows      row x model slot x tenant slot -> waiting        each process's own part, so a dead one's is taken off
    owed      model slot -> places owed in all                 read without the lock (is there any?)

A place is *owed* when an arrival in one process takes the place of a tenant whose waiters are all in other
processes: the first of those to look displaces one of its waiters (``pay``), or the tenant's next waiter to
leave pays it. A tenant never owes more places than it has waiting (what it owes beyond them is free already).
Slots are ``SharedLedger``'s; every method but ``any_owed`` is called under its lock.
"""

from __future__ import annotations

_W = 2  # waiting, owed


class SharedWaiting:
    def __init__(self, ctx, num_rows: int, max_models: int, max_tenants: int) -> None:
        self.num_rows, self.max_models, self.max_tenants = num_rows, max_models, max_tenants
        self._waiting = ctx.RawArray("q", max_models * max_tenants * _W)
        self._rows = ctx.RawArray("i", num_rows * max_models * max_tenants)
        self._owed = ctx.RawArray("q", max_models)
        self._attach()

    def _attach(self) -> None:
        self._w = memoryview(self._waiting).cast("B").cast("q")
        self._r = memoryview(self._rows).cast("B").cast("i")
        self._o = memoryview(self._owed).cast("B").cast("q")

    def __getstate__(self) -> dict:
        return {"num_rows": self.num_rows, "max_models": self.max_models, "max_tenants": self.max_tenants,
                "_waiting": self._waiting, "_rows": self._rows, "_owed": self._owed}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    def change(self, row: int | None, model: int, tenant: int, delta: int, pay: bool) -> None:
        """``delta`` more waiting of ``tenant`` in ``row``'s process; a leaving one with ``pay`` pays an owed place."""
        i = (model * self.max_tenants + tenant) * _W
        w = self._w
        w[i] = max(0, w[i] + delta)
        if row is not None:
            j = (row * self.max_models + model) * self.max_tenants + tenant
            self._r[j] = max(0, self._r[j] + delta)
        paid = 1 if delta < 0 and pay and w[i + 1] > 0 else 0
        self._set_owed(model, i, min(w[i + 1] - paid, w[i]))

    def _set_owed(self, model: int, i: int, owed: int) -> None:
        self._o[model] += owed - self._w[i + 1]
        self._w[i + 1] = owed

    def by_tenant(self, model: int) -> dict[int, int]:
        """Tenant slot -> its waiting requests (those with none left out)."""
        w, base = self._w, model * self.max_tenants * _W
        return {t: w[base + t * _W] for t in range(self.max_tenants) if w[base + t * _W]}

    def owe(self, model: int, tenant: int) -> None:
        i = (model * self.max_tenants + tenant) * _W
        self._set_owed(model, i, min(self._w[i + 1] + 1, self._w[i]))

    def any_owed(self, model: int) -> bool:
        return self._o[model] > 0

    def owed(self, model: int) -> dict[int, int]:
        """Tenant slot -> the places it owes."""
        w, base = self._w, model * self.max_tenants * _W
        return {t: w[base + t * _W + 1] for t in range(self.max_tenants) if w[base + t * _W + 1]}

    def pay(self, model: int, tenant: int) -> bool:
        i = (model * self.max_tenants + tenant) * _W
        if self._w[i + 1] <= 0:
            return False
        self._set_owed(model, i, self._w[i + 1] - 1)
        return True

    def clear_row(self, row: int) -> None:
        """A process's waiting requests are gone: off the totals (and what their tenants owed beyond the rest)."""
        r, base = self._r, row * self.max_models * self.max_tenants
        for model in range(self.max_models):
            for tenant in range(self.max_tenants):
                j = base + model * self.max_tenants + tenant
                if r[j]:
                    i = (model * self.max_tenants + tenant) * _W
                    self._w[i] = max(0, self._w[i] - r[j])
                    self._set_owed(model, i, min(self._w[i + 1], self._w[i]))
                    r[j] = 0
