"""The LoRA adapters a replica serves by name (vLLM's ``OpenAIServingModels``): ``"model"`` -> ``LoRARequest``.

    --lora-modules tiny=DIR            registered by the engine at start; served from the first request
    POST /v1/load_lora_adapter         ``load``: checked, handed to the engine (``add_lora``), then served
    POST /v1/unload_lora_adapter       ``unload``: unknown to requests at once, then dropped by the engine
    "model": "tiny"                    ``request_for``: the adapter's LoRARequest on every engine request
    GET /v1/models                     ``cards``: the base, then each adapter with ``parent`` = the base's name

Names are unique and never shadow the base model's names (its served name and path). ``lora_int_id`` (the
engine's handle) is handed out once per load and never reused, so a request cannot run with an adapter that
was unloaded and loaded again under another path. Errors (all OpenAI-shaped, none a traceback):

    400  LoRA not enabled (--enable-lora), a path that is no PEFT directory, a rank above --max-lora-rank, NaN or
         infinite weights (naming the tensor), a lora_alpha that is not a finite positive number, ...
    404  unload of a name that is not loaded
    409  load of a name already loaded (or the base model's name)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.lora_adapters import (
    LOAD_LORA_PATH,
    UNLOAD_LORA_PATH,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from kvmesh.replica.openai.responses import ModelCard
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.lora_request import LoRARequest

if TYPE_CHECKING:
    from kvmesh.replica.engine.protocol import EngineClient
    from kvmesh.replica.openai.body import Offload
    from kvmesh.replica.openai.config import FrontendConfig

logger = logging.getLogger(__name__)


class ServedLoRAs:
    """The replica's adapters by name, and the engine calls that load and drop them."""

    def __init__(self, engine_client: EngineClient, base_names: tuple[str, ...], enabled: bool,
                 registered: Iterable[LoRARequest] = ()) -> None:
        self.engine_client = engine_client
        self.base_names = base_names
        """The base model's names (served name first, then its path): no adapter may take one."""
        self.enabled = enabled
        """The engine serves adapters (``--enable-lora``)."""
        self._by_name: dict[str, LoRARequest] = {lora.lora_name: lora for lora in registered}  # --lora-modules
        self._next_id = max((lora.lora_int_id for lora in self._by_name.values()), default=0) + 1
        self._lock = asyncio.Lock()  # one load or unload at a time: a name is checked and taken atomically

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def request_for(self, model: str | None) -> LoRARequest | None:
        """The adapter ``model`` names, or None (the base model; the model check has 404'd any other name)."""
        return None if model is None else self._by_name.get(model)

    def cards(self, max_model_len: int, paths: bool = True) -> list[ModelCard]:
        """One card per adapter, vLLM's shape: ``root`` its path (its name unless ``paths``: a tenant sees no host
        path), ``parent`` the base model's served name."""
        return [ModelCard(id=name, root=lora.lora_path if paths else name, parent=self.base_names[0],
                            max_model_len=max_model_len) for name, lora in self._by_name.items()]

    async def load(self, name: str, path: str) -> LoRARequest:
        """Load adapter ``name`` from PEFT directory ``path``; it serves once this returns."""
        self._check_enabled()
        async with self._lock:
            if name in self.base_names:
                raise ProtocolError(f"The lora adapter name '{echo(name)}' is the base model's name; choose another",
                                    409, param="lora_name")
            if name in self._by_name:
                raise ProtocolError(f"The lora adapter '{echo(name)}' has already been loaded (from "
                                    f"{self._by_name[name].lora_path}); unload it first to load another path",
                                    409, param="lora_name")
            lora = LoRARequest(lora_name=name, lora_int_id=self._next_id, lora_path=path)
            self._next_id += 1
            try:
                added = await self.engine_client.add_lora(lora)
            except ValueError as e:  # the engine's LoRAError: bad path, not PEFT, rank too large, ... (says which)
                raise ProtocolError(str(e), 400, param="lora_path") from None
            if added is False:
                raise ProtocolError(f"the engine refused LoRA adapter '{echo(name)}' from {echo(path)}", 400,
                                    param="lora_path")
            # the engine's registered copy carries the identity of the weights it read (it keys the blocks)
            lora = next((o for o in self.engine_client.list_loras() if o == lora), lora)
            self._by_name[name] = lora
        logger.info("LoRA adapter %s loaded from %s (id %d)", name, path, lora.lora_int_id)
        return lora

    async def unload(self, name: str) -> None:
        """Drop adapter ``name``: requests naming it get 404 from now on; the engine frees its weights."""
        self._check_enabled()
        async with self._lock:
            lora = self._by_name.pop(name, None)
            if lora is None:
                loaded = ", ".join(sorted(self._by_name)) or "none"
                raise ProtocolError(f"The lora adapter '{echo(name)}' cannot be found (loaded: {echo(loaded)})", 404,
                                    param="lora_name")
            await self.engine_client.remove_lora(name)
        logger.info("LoRA adapter %s unloaded", name)

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ProtocolError("LoRA is not enabled on this replica: start it with --enable-lora (and "
                                "--max-lora-rank at least your adapters' rank) to load adapters", 400)


def install_lora_routes(app: FastAPI, loras: ServedLoRAs, frontend: FrontendConfig, offload: Offload) -> None:
    """``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (vLLM's; the auth middleware guards them);
    ``offload`` decodes large bodies off the loop (``PromptRenderer.run``)."""

    @app.post(LOAD_LORA_PATH)
    async def load_lora_adapter(http: Request):
        req = await read_request(http, LoadLoRAAdapterRequest, frontend, offload)
        await loras.load(req.lora_name, req.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post(UNLOAD_LORA_PATH)
    async def unload_lora_adapter(http: Request):
        req = await read_request(http, UnloadLoRAAdapterRequest, frontend, offload)
        await loras.unload(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
