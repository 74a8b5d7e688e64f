"""A completion's answer (answer.py): each choice's text (after the echoed prompt with ``echo``), then its
logprobs in the legacy shape (with the prompt's tokens when echoed), whole or streamed.

    whole    {"text", "logprobs": {"tokens", "token_logprobs", "top_logprobs", "text_offset"}}
    stream   one chunk per engine output with new text, tokens or logprobs; the echo in each choice's first
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from kvmesh.replica.openai import logprobs_format, responses
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.server import parallel_sampling
from kvmesh.replica.server.answer import Chosen, RenderedAnswer
from kvmesh.replica.server.output_usage import check_failed, usage_of
from kvmesh.replica.server.parallel_sampling import Candidate, Outputs
from kvmesh.replica.step.outputs import PromptLogprobs, RequestOutput


class CompletionAnswer(RenderedAnswer):
    """The answer to a ``/v1/completions`` request."""

    req: CompletionRequest
    chunk_class = responses.CompletionChunk

    def body(self, chosen: Chosen, finals: list[RequestOutput],
             usage: responses.UsageInfo) -> responses.CompletionResponse:
        prompt_logprobs = parallel_sampling.prompt_logprobs_of(self.candidates, finals)
        return responses.CompletionResponse(id=self.request_id, model=self.model, usage=usage, choices=[
            self.choice(index, final, candidate, prompt_logprobs.get(candidate.prompt_index))
            for index, candidate, final in chosen])

    def choice(self, index: int, final: RequestOutput, candidate: Candidate,
               prompt_logprobs: PromptLogprobs | None) -> responses.CompletionChoice:
        """A finished choice: its text (the echo first) -> its logprobs."""
        req = self.req
        text = self.echo_text(final, candidate.prompt_index) + final.text if req.echo else final.text
        logprobs = None if req.logprobs is None else logprobs_format.choice_logprobs(
            final.prompt_token_ids, prompt_logprobs, final.output_token_ids, final.logprobs, req.logprobs,
            self.decode(), req.echo)
        return responses.CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=final.finish_reason)

    def echo_text(self, out: RequestOutput, prompt_index: int) -> str:
        """The echoed prompt: as sent when it was text (and not truncated), else the tokens it ran decoded."""
        prompt, cut = self.req.prompts()[prompt_index], self.req.truncate_prompt_tokens is not None
        return prompt if isinstance(prompt, str) and not cut else self.tokenizer.decode(out.prompt_token_ids)

    async def chunks(self, created: int, streams: list[Outputs],
                     finals: list[RequestOutput | None]) -> AsyncIterator[str]:
        req, candidates = self.req, self.candidates
        continuous = req.stream_options and req.stream_options.continuous_usage_stats
        ids = req.return_token_ids  # then every step with new tokens is a chunk, even with no text yet
        first_ids = [ids] * len(candidates)  # prompt ids go once, on each choice's first chunk
        text_offsets = [0] * len(candidates)  # characters of each choice's logprobs tokens sent so far
        echoed = [not req.echo] * len(candidates)
        async for i, out in parallel_sampling.merge_streams(streams, req.stream_interval):
            check_failed(out, stream=True)
            if not (out.delta_text or out.finished or out.new_logprobs or not echoed[i] or (ids and out.new_token_ids)):
                continue
            text, logprobs, echo = out.delta_text, None, not echoed[i]
            if echo:
                text, echoed[i] = self.echo_text(out, candidates[i].prompt_index) + text, True
            if req.logprobs is not None:
                logprobs = logprobs_format.choice_logprobs(
                    out.prompt_token_ids, out.prompt_logprobs, out.new_token_ids,
                    out.new_logprobs or [None] * len(out.new_token_ids), req.logprobs, self.decode(), echo,
                    text_offsets[i])
                text_offsets[i] += sum(map(len, logprobs["tokens"]))
            chunk = responses.CompletionChunk(
                id=self.request_id, created=created, model=self.model,
                prompt_token_ids=candidates[i].request.prompt_token_ids if first_ids[i] else None,
                choices=[responses.CompletionChoice(index=parallel_sampling.choice_index(candidates[i], req.n),
                                                    text=text, logprobs=logprobs, finish_reason=out.finish_reason,
                                                    token_ids=out.new_token_ids if ids else None)],
                usage=usage_of(out) if continuous else None)
            first_ids[i] = False
            yield responses.sse(chunk)
            if out.finished:
                finals[i] = out
