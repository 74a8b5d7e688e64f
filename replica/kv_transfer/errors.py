"""What a KV transfer can fail with: each says what went wrong and what the caller can do."""

from __future__ import annotations


class KVTransferError(RuntimeError):
    """A transfer did not complete; the local blocks hold no usable data (recompute them)."""


class KVLayoutMismatch(KVTransferError):
    """A peer's block layout differs from this rank's: its block ids do not mean the same bytes here."""


class KVTransferTimeout(KVTransferError):
    """A transfer did not finish within its timeout (a dead or stalled peer)."""


class KVTransferUnavailable(KVTransferError):
    """The transport is not installed or cannot start on this machine."""
