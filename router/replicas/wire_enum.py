"""A str enum whose members are their wire values: ``enum.StrEnum``, which Python 3.10 lacks.

A member is its value in JSON (json, msgspec, pydantic), in f-strings and in ``str()``, and equals it
(``ReplicaState.READY == "ready"``), so a record's states and roles read and write exactly as strings did.
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum as WireEnum
else:
    class WireEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

__all__ = ["WireEnum"]
