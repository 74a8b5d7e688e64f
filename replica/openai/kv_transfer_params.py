"""``kv_transfer_params`` of a completion request (vLLM NixlConnector's field name), torch-free.

    prefill side:  {"do_remote_decode": true}
                   -> the response carries {"do_remote_prefill": true, "do_remote_decode": false,
                      "remote_block_ids": [...], "remote_block_media": ["GPU"|"CPU", ...], "remote_lease_id": "...",
                      "remote_engine_id": "...", "num_tokens": N}
    decode side:   {"do_remote_prefill": true, "remote_url": "http://host:port", "remote_lease_id": "..."?}
                   the replica asks the holder's /kv/lease for this prompt's blocks (showing remote_lease_id when
                   given; the holder answers it only for the chain it holds) and reads only the ids that answer
                   names; remote_url must be a registered peer's (server/kv_peers.py). ``remote_block_ids`` and
                   ``remote_block_media`` are accepted (vLLM sends them) and informational: never read.

Unknown keys are ignored (vLLM adds its own: remote_host, remote_port, tp_size, ...); a known key of the wrong
type is a 400 naming it (``kv_transfer_params.remote_block_ids``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError
from pydantic import Field

_Flag = Annotated[bool, Field(strict=True)]
_BlockId = Annotated[int, Field(strict=True, ge=0)]


class KVTransferParams(OpenAIBaseModel):
    do_remote_decode: _Flag = False
    """Prefill side: compute the prompt, lease its blocks when done, answer with the handle."""
    do_remote_prefill: _Flag = False
    """Decode side: pull the prompt's blocks from ``remote_url`` before running it."""
    remote_url: str | None = None
    """The holder's base URL (``http://host:port``)."""
    remote_block_ids: list[_BlockId] | None = None
    """The holder's block ids of the prompt's leading full blocks (informational: a puller reads only the ids the
    holder's /kv/lease answers for this prompt)."""
    remote_block_media: list[Literal["GPU", "CPU"]] | None = None
    """The tier of each of ``remote_block_ids`` on the holder (``"GPU"`` its device cache, ``"CPU"`` its host
    tier, the events' values); informational, as they are."""
    remote_lease_id: str | None = None
    """The holder's lease on the prompt's blocks (a P/D handle's): shown to its /kv/lease, released after the
    pull."""
    remote_engine_id: str | None = None
    """The holder's transfer agent name (informational: the handshake names it)."""
    num_tokens: Annotated[int, Field(strict=True, ge=0)] | None = None
    """Tokens the leased blocks hold (informational)."""

    def check(self, num_prompts: int, stream: bool) -> None:
        """A 400 naming the field for a combination the replica cannot serve."""
        if self.do_remote_decode and self.do_remote_prefill:
            raise ProtocolError("kv_transfer_params cannot set both do_remote_decode and do_remote_prefill",
                                param="kv_transfer_params")
        if (self.do_remote_decode or self.do_remote_prefill) and num_prompts != 1:
            raise ProtocolError(f"kv_transfer_params applies to one prompt; this request has {num_prompts}",
                                param="kv_transfer_params")
        if self.do_remote_decode and stream:
            raise ProtocolError("kv_transfer_params.do_remote_decode needs stream false (the handle is in the "
                                "JSON response)", param="kv_transfer_params.do_remote_decode")
        if self.remote_block_media is not None and len(self.remote_block_media) != len(self.remote_block_ids or ()):
            raise ProtocolError(f"kv_transfer_params.remote_block_media has {len(self.remote_block_media)} entries "
                                f"for {len(self.remote_block_ids or ())} remote_block_ids; give one per block id",
                                param="kv_transfer_params.remote_block_media")
        if self.do_remote_prefill:
            url = self.remote_url or ""
            if not url.startswith(("http://", "https://")):
                raise ProtocolError("kv_transfer_params.remote_url must be the holder's http(s)://host:port when "
                                    f"do_remote_prefill is true, got {self.remote_url!r}",
                                    param="kv_transfer_params.remote_url")
