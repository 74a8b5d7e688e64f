"""Which adapter sits in which device slot: ``max_loras`` slots, least recently used given up first (torch-free)."""

from __future__ import annotations

from collections import OrderedDict


class LoRASlots:
    """Adapter name -> device slot, in least-recently-used order."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first

    def assign(self, names: list[str]) -> tuple[dict[str, int], list[tuple[str, int]]]:
        """Slots for a step's distinct adapters (at most ``num_slots``, the scheduler's ``max_loras`` check):
        returns name -> slot and the (name, slot) pairs whose weights must be loaded first. Only adapters outside
        the step are given up."""
        if len(names) > self.num_slots:
            raise ValueError(f"a step uses {len(names)} LoRA adapters but there are {self.num_slots} slots "
                             "(max_loras); the scheduler must keep a step within max_loras")
        wanted = set(names)
        to_load = []
        for name in names:
            if name in self._slot_of:
                self._slot_of.move_to_end(name)
                continue
            if not self._free:
                victim = next(n for n in self._slot_of if n not in wanted)  # the least recently used outside
                self._free.append(self._slot_of.pop(victim))
            slot = self._slot_of[name] = self._free.pop()
            to_load.append((name, slot))
        return {name: self._slot_of[name] for name in names}, to_load

    def release(self, name: str) -> int | None:
        """Give up ``name``'s slot (a removed adapter); returns the slot or None when it held none."""
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._free.append(slot)
        return slot

    @property
    def resident(self) -> list[str]:
        """Adapters in a slot, least recently used first."""
        return list(self._slot_of)
