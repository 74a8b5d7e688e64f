"""Engine configurations a run compares: ``backend:block_size[:graphs]`` strings, parsed at the edge.

    default                 what EngineConfig picks by itself (backend, block size, no graphs)
    torch:16                the plain-torch attention backend, 16-token blocks
    flash_attn:256:graphs   flash-attn over a 256-token paged cache, decode steps from CUDA graphs

The backend may be any name of ``kvmesh.replica.attention.backend.available_backends()``.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT = "backend:block_size[:graphs], e.g. torch:16 or flash_attn:256:graphs"


@dataclass(frozen=True, slots=True)
class EngineVariant:
    """One engine configuration under test."""

    backend: str | None = None
    """Attention backend registry name; None lets the engine pick (the default configuration)."""
    block_size: int | None = None
    """Tokens per KV block; None keeps EngineConfig's default."""
    cuda_graphs: bool = False
    """Replay decode-only steps from CUDA graphs."""

    @property
    def label(self) -> str:
        if self.backend is None and self.block_size is None and not self.cuda_graphs:
            return "default"
        return f"{self.backend}:{self.block_size}" + (":graphs" if self.cuda_graphs else "")

    def engine_kwargs(self) -> dict:
        """The EngineConfig fields this variant sets (none for the default)."""
        kw: dict = {"attention_backend": self.backend, "cuda_graphs": self.cuda_graphs}
        if self.block_size is not None:
            kw["block_size"] = self.block_size
        return kw


DEFAULT = EngineVariant()


def parse_variants(text: str, backends: list[str]) -> list[EngineVariant]:
    """``"torch:16,flash_attn:256:graphs"`` -> variants; ValueError naming the bad entry and the format."""
    variants = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if entry == "default":
            variants.append(DEFAULT)
            continue
        parts = entry.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"--configs entry {entry!r} is not {FORMAT}")
        backend, size, *rest = parts
        if backend not in backends:
            raise ValueError(f"--configs entry {entry!r}: unknown attention backend {backend!r}; "
                             f"choose one of {', '.join(backends)}")
        if not size.isdigit() or int(size) < 1:
            raise ValueError(f"--configs entry {entry!r}: block size {size!r} must be a positive integer ({FORMAT})")
        if rest and rest[0] != "graphs":
            raise ValueError(f"--configs entry {entry!r}: the third part may only be 'graphs', got {rest[0]!r}")
        variants.append(EngineVariant(backend, int(size), bool(rest)))
    return variants
