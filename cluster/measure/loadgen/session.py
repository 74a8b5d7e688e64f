"""Turns a session's turns into OpenAI request bodies, carrying the conversation history.

=====================  ======================================================================
api / prompt format    prompt of turn k
=====================  ======================================================================
completions, tokens    history + turn.user, as a list of token ids (exact lengths); the
                       answer joins the history as ``completion_tokens`` filler ids (the
                       server's text cannot be turned back into ids without its tokenizer)
completions, text      history + turn.user as one string; the answer's text joins the history
chat                   messages: system, then user/assistant pairs with the real answers
=====================  ======================================================================

A multi-turn session stops before a turn whose prompt would exceed ``max_prompt_tokens``
(estimated from the server's last ``usage.prompt_tokens`` + answer + the new message).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.cluster.measure.workloads.prompts import PromptMaker
from kvmesh.cluster.measure.workloads.sessions import Session, Turn


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """Fields every request carries."""

    model: str
    api: str = "completions"
    """``completions`` or ``chat``."""
    temperature: float = 0.0
    ignore_eos: bool = True
    """Ask for exactly ``max_tokens`` tokens (vLLM/kvmesh extension; disable for servers that reject it)."""
    cache_salt: str | None = None
    """Sent as ``cache_salt`` (isolates this run's cache entries from earlier runs)."""
    extra_body: dict = field(default_factory=dict)


class SessionState:
    def __init__(self, session: Session, options: RequestOptions, maker: PromptMaker, max_prompt_tokens: int):
        self.session = session
        self.options = options
        self.maker = maker
        self.max_prompt_tokens = max_prompt_tokens
        self.history: list = []  # token ids, text pieces, or chat messages
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.truncated = False

    @property
    def multi_turn(self) -> bool:
        return bool(self.session.extra.get("multi_turn")) or len(self.session.turns) > 1

    def _estimate(self, turn: Turn) -> int:
        user = turn.user
        new = len(user) if isinstance(user, list) else len(user.split()) * self.maker.tokens_per_word
        return int(self.last_prompt_tokens + self.last_completion_tokens + new)

    def fits(self, turn_index: int) -> bool:
        """False when the turn would overflow the budget (the session then ends)."""
        if turn_index == 0:
            return True
        if self._estimate(self.session.turns[turn_index]) > self.max_prompt_tokens:
            self.truncated = True
            return False
        return True

    def body(self, turn_index: int) -> tuple[str, dict]:
        """(path, JSON body) of the session's turn ``turn_index``."""
        turn = self.session.turns[turn_index]
        o = self.options
        body: dict = {"model": self.session.model or o.model, "max_tokens": turn.max_tokens,
                      "temperature": o.temperature,
                      "stream": True, "stream_options": {"include_usage": True}}
        if o.ignore_eos:
            body["ignore_eos"] = True
        if o.cache_salt is not None:
            body["cache_salt"] = o.cache_salt
        body.update(o.extra_body)
        if o.api == "chat":
            if turn_index == 0:
                self.history = [{"role": "system", "content": _as_text(turn.system)}] if turn.system else []
            body["messages"] = [*self.history, {"role": "user", "content": _as_text(turn.user)}]
            return "/v1/chat/completions", body
        if turn_index == 0:
            self.history = [turn.system] if turn.system else []
        if isinstance(turn.user, list):
            prompt: list[int] | str = [t for part in self.history for t in part] + turn.user
        else:
            prompt = "\n\n".join([*self.history, turn.user])
        body["prompt"] = prompt
        return "/v1/completions", body

    def record(self, turn_index: int, body: dict, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Fold the turn's answer into the history."""
        turn = self.session.turns[turn_index]
        self.last_prompt_tokens = prompt_tokens or self._estimate(turn)
        self.last_completion_tokens = completion_tokens
        if self.options.api == "chat":
            self.history = [*body["messages"], {"role": "assistant", "content": text}]
        elif isinstance(turn.user, list):
            filler = self.maker.tokens(completion_tokens, ("answer", self.session.session_id, turn_index))
            self.history = [list(body["prompt"]) + filler]
        else:
            self.history = [body["prompt"] + text]


def _as_text(piece) -> str:
    if isinstance(piece, list):
        raise ValueError("the chat API needs text prompts: use --prompt-format text with --api chat")
    return piece
