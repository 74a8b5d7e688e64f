"""Value checks shared by the serve config sections (cluster/config.py): sizes, ports, policies."""

from __future__ import annotations

import difflib
import inspect
import re

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: int | str | None, what: str) -> int | None:
    """``"512MiB"``, ``"1GiB"``, ``"2e9"`` or an int -> bytes (None stays None)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{what}={value!r} is not a size; use bytes or a unit, e.g. 512MiB or 2GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_port(port: int, what: str, allow_zero: bool = True) -> None:
    low = 0 if allow_zero else 1
    check(low <= port <= 65535, f"{what}={port} is not a TCP port; use {low}..65535"
          + (" (0 = ephemeral, reported through Ray)" if allow_zero else ""))


def check_policy(policy: str, weights: dict[str, float]) -> None:
    """The policy exists in the router's registry and takes every weight as an option."""
    from kvmesh.router.policies import POLICIES  # torch-free

    check(policy in POLICIES, f"router.policy={policy!r} is not a routing policy"
          f"{did_you_mean(policy, list(POLICIES))}; choose one of {', '.join(POLICIES)}")
    options = {name for klass in POLICIES[policy].__mro__ if "__init__" in vars(klass)
               for name in inspect.signature(klass.__init__).parameters} - {"self", "kwargs", "block_size", "seed"}
    for name in weights:
        check(name in options, f"router.policy_weights.{name} is not an option of policy {policy!r}"
              f"{did_you_mean(name, sorted(options))}; its options: {', '.join(sorted(options)) or 'none'}")


def did_you_mean(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
