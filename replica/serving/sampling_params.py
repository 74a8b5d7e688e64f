"""How to pick the next token of a request, and when to stop (vLLM's ``SamplingParams``)."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from kvmesh.replica.serving.read_only_lists import read_only_bias, read_only_ids
from kvmesh.replica.serving.sampling_params_error import SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

__all__ = ["MAX_LOGPROBS", "MAX_STOP_STRINGS", "SEED_MIX", "SamplingParams", "SamplingParamsError", "context_overflow",
           "continuation_seed"]

SEED_MIX = (6364136223846793005, 1442695040888963407, (1 << 63) - 1)
"""(A, B, MASK): a seeded request draws its n-th token from the key ``(seed*A + n*B + 1) & MASK``
(sample/draws.py: seed_key, hashed on the device by seeded_uniforms), so its tokens depend only on the seed
and their position."""


def continuation_seed(seed: int, num_generated: int) -> int:
    """The seed under which a request re-started after ``num_generated`` tokens (a migrated stream, whose
    prompt now holds them) draws exactly what the original would have: ``seed'*A == seed*A + num_generated*B``."""
    a, b, mask = SEED_MIX
    return (seed + num_generated * b * pow(a, -1, mask + 1)) & mask


MAX_LOGPROBS = 20
"""Most top logprobs per token a request may ask for (vLLM's default ``max_logprobs``; OpenAI allows 20)."""
MAX_STOP_STRINGS = 128
"""Most stop strings one request may send: each is looked for in the text after every token of every choice, on the
engine thread, so their number multiplies what every step costs everyone (OpenAI allows 4; vLLM sets no limit)."""


def context_overflow(prompt_len: int, max_tokens: int, max_model_len: int) -> str | None:
    """What is wrong when a prompt of ``prompt_len`` tokens plus ``max_tokens`` to generate do not fit a context
    of ``max_model_len`` tokens, or None when they fit: the rule, written once in vLLM's words (clients recognise a
    context overflow by them; the HTTP layer and the engine each add what to do)."""
    needed = prompt_len + max_tokens
    if prompt_len < max_model_len and needed <= max_model_len:
        return None
    return (f"This model's maximum context length is {max_model_len} tokens. However, you requested {max_tokens} "
            f"output tokens and your prompt contains at least {prompt_len} input tokens, for a total of at least "
            f"{needed} tokens. Please reduce the length of the input prompt or the number of requested output tokens.")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling and stopping rules. Validated on construction."""

    max_tokens: int = 16
    """Most tokens to generate (>= 1)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability mass is >= top_p (0 < top_p <= 1)."""
    top_k: int = -1
    """Keep only the k most likely tokens; -1 (or 0) keeps all."""
    seed: int | None = None
    """Per-request random seed: the same seed and prompt give the same tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends when the text contains one; it is not returned."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end generation (returned in the token ids, not in the text)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS token."""
    min_tokens: int = 0
    """Do not stop (on EOS or stop tokens) before this many tokens."""
    logprobs: int | None = None
    """Per generated token, return the sampled token's log-probability plus the ``logprobs`` most likely
    tokens' (0: the sampled token's only; None: none). Raw model distribution: log_softmax of the logits
    before logit_bias, temperature, top-k/top-p (vLLM's default ``logprobs_mode="raw_logprobs"``)."""
    prompt_logprobs: int | None = None
    """The same for every prompt token after the first. Such a request does not read the prefix cache
    (every prompt position needs its logits), as in vLLM; it still fills the cache for others."""
    logit_bias: dict[int, float] | None = None
    """Token id -> value added to that token's logit before sampling (each in [-100, 100], as OpenAI)."""
    skip_special_tokens: bool = True
    """Leave the tokenizer's special tokens (``</s>``, ...) out of the output text (vLLM's default)."""
    include_stop_str_in_output: bool = False
    """Keep the stop string that ended the text at its end (by default it is cut off)."""
    allowed_token_ids: list[int] | None = None
    """Sample only among these token ids (vLLM's; None: any)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the output holds (vLLM's; in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Times each token's count in the output, subtracted from its logit (vLLM's; in [-2, 2])."""
    repetition_penalty: float = 1.0
    """Logits of tokens in the prompt or output are divided by it where positive, multiplied where not (> 0)."""
    min_p: float = 0.0
    """Drop tokens whose probability (after temperature) is below min_p x the most likely one's (in [0, 1])."""
    structured_outputs: StructuredOutputsParams | None = None
    """What the output must match (a JSON schema, a regex, a choice, a grammar; structured_outputs.py); None: free."""
    _checked_lists: tuple = field(default=(), init=False, repr=False, compare=False)
    """(the token lists ``validate`` last checked, read-only, their sizes, their largest token id, their stop sets by
    EOS ids): a copy that keeps them (an n child: ``child``) is not walked again; lists assigned since are."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def __copy__(self) -> SamplingParams:
        sp = SamplingParams.__new__(SamplingParams)
        for name, value in object.__getstate__(self)[1].items():  # all of it: copies share the checked lists
            setattr(sp, name, value)  # and their stop sets
        return sp

    def __getstate__(self) -> tuple[None, dict]:
        """What pickle and deepcopy keep: the fields, and what ``validate`` remembers without the stop sets (made
        again where they are read: a tensor-parallel rank never reads them)."""
        state = object.__getstate__(self)[1]  # the slots' values
        if self._checked_lists:
            state["_checked_lists"] = (*self._checked_lists[:3], {})
        return None, state

    def child(self, **changes) -> SamplingParams:
        """A copy with ``changes`` (an n child's seed, logprobs: vLLM's child sampling params) that shares this one's
        token lists, checked once for all the children."""
        sp = copy.copy(self)
        for name, value in changes.items():
            setattr(sp, name, value)
        sp.validate()
        return sp

    def as_dict(self) -> dict:
        """The fields as a request sends them (vLLM's names), without what ``validate`` remembers."""
        bare = copy.copy(self)
        bare._checked_lists = ()
        fields = {name: value for name, value in asdict(bare).items() if name != "_checked_lists"}
        for name, plain in (("stop_token_ids", list), ("allowed_token_ids", list), ("logit_bias", dict)):
            if fields[name] is not None:  # the read-only copies as the list and dict a request sends
                fields[name] = plain(fields[name])
        return fields

    @property
    def largest_token_id(self) -> int:
        """The largest token id of logit_bias, allowed_token_ids and stop_token_ids as ``validate`` last saw them
        (-1: none)."""
        return self._checked()[2]

    def stop_set(self, eos_token_ids: frozenset[int]) -> frozenset[int]:
        """``eos_token_ids`` and the stop token ids as one set: any of them ends the request (made once for the copies
        that share the lists)."""
        sets = self._checked()[3]
        found = sets.get(eos_token_ids)
        if found is None:
            found = sets[eos_token_ids] = eos_token_ids | frozenset(self.stop_token_ids)
        return found

    def _checked(self) -> tuple:
        """What ``validate`` remembers of the token lists, validating lists assigned since (raises for bad ones)."""
        if not self._lists_unchanged():
            self.validate()
        return self._checked_lists

    def _token_lists(self) -> tuple:
        return self.logit_bias, self.allowed_token_ids, self.stop_token_ids

    def _lists_unchanged(self) -> bool:
        checked = self._checked_lists
        return bool(checked) and all(a is b and (a is None or len(a) == n)
                                     for a, b, n in zip(checked[0], self._token_lists(), checked[1], strict=True))

    def _remember_lists(self) -> None:
        """Keep read-only copies of the checked lists (read_only_lists.py: what was checked stays what the engine
        reads), and what the copies that share them need."""
        # token ids are a set of the vocabulary's: a list repeating them costs each step what its distinct ids cost
        self.stop_token_ids = read_only_ids(self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = read_only_ids(self.allowed_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = read_only_bias(self.logit_bias)
        lists = self._token_lists()
        largest = max((max(ids, default=-1) for ids in lists if ids), default=-1)
        self._checked_lists = (lists, tuple(-1 if ids is None else len(ids) for ids in lists), largest, {})

    def validate(self) -> None:
        """Raise SamplingParamsError naming the first invalid field (the engine re-checks params it is handed:
        the dataclass is mutable; token lists it has checked are not walked again)."""
        fresh = not self._lists_unchanged()
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingParamsError("max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise SamplingParamsError("temperature", f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise SamplingParamsError(
                "top_k", f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens", f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if not all(self.stop):  # any(not s for s in stop), without a generator
            raise SamplingParamsError("stop", "stop strings must be non-empty")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingParamsError("stop", f"stop has {len(self.stop)} strings; the limit is {MAX_STOP_STRINGS}")
        ids = self.stop_token_ids
        if fresh and any(not isinstance(t, int) or t < 0 for t in ids):
            raise SamplingParamsError("stop_token_ids", f"stop_token_ids must be non-negative integers, got {ids!r}")
        if self.logprobs is not None or self.prompt_logprobs is not None:  # most requests ask for none
            self._validate_logprobs()
        if fresh and self.allowed_token_ids is not None and (not self.allowed_token_ids or any(
                not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.allowed_token_ids)):
            raise SamplingParamsError("allowed_token_ids", "allowed_token_ids must be a non-empty list of "
                                      f"non-negative token ids, got {self.allowed_token_ids!r}")
        self._validate_penalties()
        for token_id, bias in (self.logit_bias or {}).items() if fresh else ():
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                raise SamplingParamsError(
                    "logit_bias", f"logit_bias keys must be non-negative token ids, got {token_id!r}")
            if not isinstance(bias, int | float) or not -100.0 <= bias <= 100.0:
                raise SamplingParamsError(
                    "logit_bias", f"logit_bias[{token_id}] must be a number in [-100, 100], got {bias!r}")
        if fresh:
            self._remember_lists()

    def _validate_logprobs(self) -> None:
        for name, value in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise SamplingParamsError(
                    name, f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {value!r}")

    def _validate_penalties(self) -> None:
        for name, value in (("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not -2.0 <= value <= 2.0:
                raise SamplingParamsError(name, f"{name} must be in [-2, 2], got {value!r}")
        rep = self.repetition_penalty
        if not isinstance(rep, (int, float)) or isinstance(rep, bool) or not rep > 0.0:
            raise SamplingParamsError("repetition_penalty", f"repetition_penalty must be > 0, got {rep!r}")
        if not isinstance(self.min_p, (int, float)) or isinstance(self.min_p, bool) or not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamsError("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")

    @property
    def penalized(self) -> bool:
        """Some penalty applies: the runner keeps the request's token counts on the device."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature == 0.0 or self.top_k == 1
