"""``torch.ops.kvmesh``: where each fused kernel registers itself as a torch op (see custom_op.py for why)."""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIBRARY = torch.library.Library("kvmesh", "FRAGMENT")  # the ``torch.ops.kvmesh`` namespace


def direct_register_custom_op(name: str, schema: str, impl: Callable, fake_impl: Callable) -> None:
    """Define ``torch.ops.kvmesh.<name>`` (``schema`` without the name, e.g. ``"(Tensor x) -> Tensor"``):
    ``impl`` runs on every real device, ``fake_impl`` on meta (shapes only)."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    _LIBRARY.impl(name, fake_impl, "Meta")
