"""The fake replica's LoRA adapters: vLLM's runtime endpoints, without weights.

``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` "loads" an adapter when its path is a directory (a
real load fails on any other path), ``POST /v1/unload_lora_adapter {"lora_name"}`` drops it; ``/v1/models``
lists each with its ``parent`` (the fake's model) and ``root`` (its path), as vLLM does. Every call is kept
with the Authorization it carried (``/fake/stats``' ``adapter_calls``), so tests see who asked.
"""

from __future__ import annotations

import os

from kvmesh.cluster.measure.benchmarks.support.fake_answers import JSONBody


class FakeAdapters:
    """The adapters one fake replica has (see the module doc)."""

    def __init__(self) -> None:
        self.adapters: dict[str, str] = {}
        """Adapter name -> the path it was loaded from."""
        self.calls: list[JSONBody] = []
        """Each load/unload call: its names, whether it loaded, and its Authorization header."""

    def call(self, load: bool, body: JSONBody, auth: str) -> tuple[int, JSONBody]:
        """Answer one load (``load``) or unload call: (status, body)."""
        name, path = body.get("lora_name"), body.get("lora_path")
        self.calls.append({"load": load, "lora_name": name, "lora_path": path, "auth": auth})
        if not isinstance(name, str) or (load and not (isinstance(path, str) and os.path.isdir(path))):
            return 400, {"error": {"message": f"cannot load adapter {name!r} from {path!r}", "code": 400}}
        if load:
            self.adapters[name] = path
        elif self.adapters.pop(name, None) is None:
            return 404, {"error": {"message": f"adapter {name!r} is not loaded", "code": 404}}
        return 200, {"ok": True}

    def cards(self, parent: str) -> list[JSONBody]:
        """``/v1/models`` entries of the adapters (vLLM's shape)."""
        return [{"id": name, "object": "model", "owned_by": "fake", "root": root, "parent": parent}
                for name, root in self.adapters.items()]
