"""A stored Responses conversation through routers on different Ray nodes, one of them killed between its turns.

    turn 1  router 1 (node B)   POST /v1/responses                    stored in the routers' database
    turn 2  router 0 (node A)   previous_response_id = turn 1         finds it there; its prefix cached
            router 1 SIGKILLed, restarted by Ray on node B
    turn 3  router 1 (node B)   previous_response_id = turn 2         the restarted router finds it there
    then    every router        GET /v1/responses/{id} of each turn   the owner's key: all there; another
                                                                      tenant's: none

Every turn is one tenant's (its key in the routers' keys file); a second tenant's key must find none of them.
What a turn reports: its HTTP status, its router and that router's node, and the prompt tokens the replica had
cached (``usage.input_tokens_details.cached_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from kvmesh.router.routing.receipts import HEADER_BEST, HEADER_OPT_IN, HEADER_REASON, HEADER_REPLICA, receipt_headers

STORY = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog "
         "Max. One day the sun was shining and the birds were singing in the tall green trees. Lily ran to the "
         "big old oak tree and sat down under it with her favourite book.")
"""The first turn: several full KV blocks of stories260K tokens, so a continuation can find them cached."""
NEXT = ("What did Lily do next?", "And then what happened?")
"""The second and third turns."""
OUTPUT_TOKENS = 8
"""Tokens each turn generates."""
TIMEOUT_S = 60.0
"""Longest wait for one turn or one read."""


@dataclass(frozen=True, slots=True)
class TalkKeys:
    """The two tenants' API keys (each its tenant in the routers' keys file)."""

    owner: str
    """The tenant whose conversation it is."""
    stranger: str
    """Another tenant: it must see none of the owner's responses."""


@dataclass(slots=True)
class Talk:
    """One conversation's turns as they happen (``say``), then what every router finds of them (``check``)."""

    model: str
    keys: TalkKeys
    node_of: Callable[[int], str]
    """The Ray node id a router runs on (asked when the turn is sent)."""
    turns: list[dict] = field(default_factory=list)
    """Per turn: router, node, status, cached_tokens, input_tokens, error, and from its route receipt the replica, why
    it was chosen (``route_reason``) and the best hit any replica offered (``best_hit_tokens``)."""
    stored: list[dict] = field(default_factory=list)
    """The answered turns' Response objects."""

    async def say(self, url: str, router: int) -> None:
        """The next turn through the router at ``url`` (index ``router``), continuing the last answered one."""
        text = NEXT[len(self.turns) - 1] if self.turns else STORY
        body: dict = {"model": self.model, "input": text, "max_output_tokens": OUTPUT_TOKENS, "temperature": 0}
        if self.stored:
            body["previous_response_id"] = self.stored[-1]["id"]
        turn: dict = {"router": router, "node": self.node_of(router)}
        try:
            status, answer, receipt = await _call(url, "POST", "/v1/responses", self.keys.owner, body,
                                                  {HEADER_OPT_IN: "1"})
        except (aiohttp.ClientError, TimeoutError) as e:
            status, answer, receipt = None, {"error": {"message": type(e).__name__}}, {}
        usage = answer.get("usage") or {}
        turn.update(status=status, cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
                    input_tokens=usage.get("input_tokens", 0),
                    error=None if status == 200 else str((answer.get("error") or {}).get("message"))[:300],
                    replica=receipt.get(HEADER_REPLICA), route_reason=receipt.get(HEADER_REASON),
                    best_hit_tokens=int(receipt.get(HEADER_BEST, 0)))
        self.turns.append(turn)
        if status == 200:
            self.stored.append(answer)

    async def check(self, urls: list[str]) -> dict:
        """The turns, and what each router answers for each stored response: the owner's key must find it as it
        was answered, the stranger's key must get a 404."""
        found = shown = 0
        for url in urls:
            for stored in self.stored:
                path = f"/v1/responses/{stored['id']}"
                status, answer, _ = await _call(url, "GET", path, self.keys.owner)
                found += status == 200 and answer.get("output") == stored["output"]
                status, _, _ = await _call(url, "GET", path, self.keys.stranger)
                shown += status != 404
        chained = all(later.get("previous_response_id") == earlier["id"]
                      for earlier, later in zip(self.stored, self.stored[1:], strict=False))
        return {"turns": self.turns, "answered": len(self.stored), "chained": chained, "routers": len(urls),
                "found_by_owner": found, "expected": len(urls) * len(self.stored), "shown_to_stranger": shown}


async def _call(url: str, method: str, path: str, key: str, body: dict | None = None,
                extra_headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    """Status, JSON body and the route receipt's headers (lower-cased; empty unless asked for)."""
    headers = {"Authorization": f"Bearer {key}", **(extra_headers or {})}
    async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), headers=headers) as http,
                http.request(method, url + path, json=body) as response):
        return response.status, await response.json(content_type=None), receipt_headers(response.headers)


def conversation_line(result: dict, killed: int) -> str:
    """``Talk.check``'s result as one line (the benchmark's output)."""
    turns = "; ".join(f"router {t['router']}: {t['status']}, {t['cached_tokens']} of {t['input_tokens']} input "
                      "tokens cached" for t in result["turns"])
    nodes = len({t["node"] for t in result["turns"]})
    return (f"Stored responses ({result['store']}), a conversation through routers on {nodes} nodes, router "
            f"{killed} killed before turn 3: {turns}. Found by their tenant through every router: "
            f"{result['found_by_owner']} of {result['expected']}; shown to another tenant: "
            f"{result['shown_to_stranger']}.")
