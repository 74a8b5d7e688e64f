"""Offline batch generation (vLLM's ``LLM``): ``LLM(model=...).generate(prompts, sampling_params)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, TypedDict

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.outputs import RequestOutput


class _SaltedPrompt(TypedDict, total=False):
    cache_salt: str
    """Tenant isolation: prompts with different salts share no cached blocks."""


class TextPrompt(_SaltedPrompt):
    """A prompt as text (vLLM's ``TextPrompt``), tokenized with the model's tokenizer."""

    prompt: str
    """The text; special tokens are added as Hugging Face does."""


class TokensPrompt(_SaltedPrompt):
    """A prompt as token ids (vLLM's ``TokensPrompt``)."""

    prompt_token_ids: list[int]
    """The token ids, used as they are."""


PromptType = str | list[int] | TextPrompt | TokensPrompt
"""One prompt of ``LLM.generate``."""


class LLM:
    """Load a model and generate for a batch of prompts; returns outputs in prompt order.

    Prompts are strings (tokenized with the model's tokenizer, special tokens added as HF does),
    token id lists, or dicts with "prompt" or "prompt_token_ids" (and optionally "cache_salt").
    Extra keyword arguments are ``EngineConfig`` fields.
    """

    def __init__(self, model: str, tokenizer: str | None = None, **config_kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, tokenizer=tokenizer, **config_kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self) -> HFTokenizer | None:
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """``lora_request``: the LoRA adapter of every prompt, or one per prompt (None: the base model).
        ``priority``: one per prompt (vLLM's), lower first; needs ``scheduling_policy="priority"``."""
        prompts = _as_prompt_list(prompts)
        loras = _per_prompt(lora_request, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts; pass one per prompt")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(params_list)} sampling_params for {len(prompts)} prompts; "
                                 "pass one SamplingParams or one per prompt")
        engine = self.llm_engine
        request_ids: list[str] = []
        try:
            for i, (prompt, params, lora) in enumerate(zip(prompts, params_list, loras, strict=True)):
                token_ids, salt = self._tokenize(prompt)
                request_ids.append(str(next(self._ids)))
                engine.add_request(EngineRequest(request_ids[-1], token_ids, params, cache_salt=salt, lora_request=lora,
                                                 priority=0 if priority is None else priority[i]))
        except Exception:
            engine.abort_request(request_ids)
            engine.step()  # collect the abort outputs
            raise
        return self._run(request_ids, use_tqdm)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        progress = None
        if use_tqdm:
            from tqdm import tqdm

            progress = tqdm(total=len(request_ids), desc="generate")
        wanted = set(request_ids)
        while len(finals) < len(request_ids):
            for out in self.llm_engine.step():
                if out.finished and out.request_id in wanted:
                    finals[out.request_id] = out
                    if progress is not None:
                        progress.update(1)
        if progress is not None:
            progress.close()
        return [finals[rid] for rid in request_ids]

    def _tokenize(self, prompt: PromptType) -> tuple[list[int], str | None]:
        salt = None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), salt
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            tokenizer = self.llm_engine.tokenizer
            if tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass prompts as token id lists")
            return list(tokenizer.encode(prompt)), salt
        return list(prompt), salt


def _per_prompt(lora: LoRARequest | Sequence[LoRARequest | None] | None, n: int) -> list[LoRARequest | None]:
    if lora is None or isinstance(lora, LoRARequest):
        return [lora] * n
    loras = list(lora)
    if len(loras) != n:
        raise ValueError(f"got {len(loras)} lora_requests for {n} prompts; pass one LoRARequest or one per prompt")
    return loras


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, str | dict):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):  # one prompt given as token ids
        return [prompts]
    return prompts
