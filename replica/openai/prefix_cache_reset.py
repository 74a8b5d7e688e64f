"""``POST /reset_prefix_cache`` (vLLM's admin route), torch-free: the path both servers answer.

    replica   every cached block no request holds stops being cached (all of them, with ``AllBlocksCleared``
              on the event stream as vLLM sends it, when none is held; else one ``BlockRemoved``)
              -> 200 {"freed_blocks": N}
    router    asks every replica (with the internal key) -> 200 {"replicas": {ID: {"freed_blocks": N}}}, a
              replica that failed with {"error": why}; its index learns of the reset through the replicas' events

Both are the admin plane: the admin key (or the internal key), never a tenant's API key.
"""

from __future__ import annotations

RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache"
