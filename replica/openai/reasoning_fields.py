"""The chat request's reasoning field (a mixin of ``ChatCompletionRequest``) and what the server's reasoning parser
(``--reasoning-parser``) makes of a request, read as vLLM reads them.

    include_reasoning  true (the default): the answer's reasoning is returned as ``reasoning_content`` (and
                       ``reasoning``, vLLM's newer name); false: it is left out, and so are the logprobs and token
                       ids that would spell it. Either way the content is the answer after the reasoning.

The request's template variables say whether the model thinks at all (Qwen3's ``enable_thinking``, which
``reasoning_effort: "none"`` sets false); a constraint (structured outputs, a forced tool call) then waits for the
end of the reasoning when it does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from kvmesh.replica.openai.reasoning_parsers import ReasoningParser, reasoning_parser
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.sampling_params import SamplingParams
from pydantic import Field


class ReasoningFields(OpenAIBaseModel):
    """vLLM's ``include_reasoning``."""

    include_reasoning: Annotated[bool, Field(strict=True)] = True
    """Return the reasoning the server's reasoning parser reads out of the answer (vLLM's default: true)."""

    def reasoning_parser(self, name: str | None, constrained: bool = False) -> ReasoningParser | None:
        """The parser ``name`` (the server's ``--reasoning-parser``) for this request's answer, or None
        (``constrained``: its content is the output of a constraint that waits for the reasoning)."""
        return None if name is None else reasoning_parser(name, self.template_kwargs(), constrained)

    def hides_reasoning(self, name: str | None) -> bool:
        """The answer's reasoning, and the logprobs and token ids that would spell it, are left out."""
        return name is not None and not self.include_reasoning

    def constrain_after_reasoning(self, name: str | None, params: list[SamplingParams]) -> None:
        """Make the constraints of ``params`` wait for the end of the reasoning when the model thinks."""
        wait_for_reasoning(self.reasoning_parser(name, constrained=True), params)


def wait_for_reasoning(parser: ReasoningParser | None, params: list[SamplingParams]) -> None:
    """Make the constraints of ``params`` wait for the end of the reasoning when the model thinks (``parser``: the
    answer's; None: the server has no reasoning parser, so they apply from the first token)."""
    if parser is None or not parser.thinking:
        return
    for sp in params:
        if sp.structured_outputs is not None:
            sp.structured_outputs = replace(sp.structured_outputs, reasoning_end=parser.end_tag,
                                            reasoning_end_pattern=parser.end_pattern)
