"""A chat's answer (answer.py): each choice's text read for its reasoning, then for its tool calls
(chat_answer.py), then its logprobs (hidden with the reasoning), whole as one message or streamed as deltas.

    whole    {"message": {"reasoning_content", "content", "tool_calls"}, "logprobs": {"content": [...]}}
    stream   {"role": "assistant", "content": ""} first for each choice, then the deltas the readers let through
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from kvmesh.replica.openai import logprobs_format, responses
from kvmesh.replica.openai.protocol import ChatCompletionRequest
from kvmesh.replica.server import chat_answer, parallel_sampling
from kvmesh.replica.server.answer import Chosen, RenderedAnswer
from kvmesh.replica.server.output_usage import check_failed, own_error, usage_of
from kvmesh.replica.server.parallel_sampling import Outputs
from kvmesh.replica.step.outputs import RequestOutput, TokenLogprobs


class ChatAnswer(RenderedAnswer):
    """The answer to a ``/v1/chat/completions`` request."""

    req: ChatCompletionRequest
    chunk_class = responses.ChatCompletionChunk

    def body(self, chosen: Chosen, finals: list[RequestOutput],
             usage: responses.UsageInfo) -> responses.ChatCompletionResponse:
        return responses.ChatCompletionResponse(id=self.request_id, model=self.model, usage=usage,
                                                choices=[self.choice(index, final) for index, _, final in chosen])

    def choice(self, index: int, final: RequestOutput) -> responses.ChatCompletionChoice:
        """A finished choice: reasoning -> tools (its message and finish reason) -> logprobs."""
        message, reason = chat_answer.message(self.req, self.frontend, final.text, final.finish_reason)
        return responses.ChatCompletionChoice(index=index, message=message, finish_reason=reason,
                                              logprobs=self.logprobs(final.output_token_ids, final.logprobs))

    def logprobs(self, token_ids: list[int], entries: list[TokenLogprobs] | None) -> dict | None:
        """The choice's (or a delta's) tokens' logprobs; none while the reasoning is hidden."""
        req = self.req
        if not req.logprobs or entries is None or req.hides_reasoning(self.frontend.reasoning_parser):
            return None
        return logprobs_format.chat_logprobs(token_ids, entries, req.top_logprobs or 0, self.decode())

    async def chunks(self, created: int, streams: list[Outputs],
                     finals: list[RequestOutput | None]) -> AsyncIterator[str]:
        req, candidates, frontend = self.req, self.candidates, self.frontend
        continuous = req.stream_options and req.stream_options.continuous_usage_stats
        hidden = req.hides_reasoning(frontend.reasoning_parser)  # no token ids or logprobs then
        ids = req.return_token_ids and not hidden  # then every step with new tokens is a chunk, even with no text yet

        def chunk(index: int, delta: responses.DeltaMessage, finish_reason: str | None = None,
                  usage: responses.UsageInfo | None = None, logprobs: dict | None = None,
                  token_ids: list[int] | None = None, first_ids: list[int] | None = None,
                  error: dict | None = None) -> str:
            return responses.sse(responses.ChatCompletionChunk(
                id=self.request_id, created=created, model=self.model, usage=usage, prompt_token_ids=first_ids,
                choices=[responses.ChatStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                                    finish_reason=finish_reason,
                                                    token_ids=token_ids if ids else None, error=error)]))

        for c in candidates:
            yield chunk(parallel_sampling.choice_index(c, req.n),
                        responses.DeltaMessage(role="assistant", content=req.echo_text()), token_ids=[],
                        first_ids=c.request.prompt_token_ids if ids else None)
        readers = chat_answer.streams(req, frontend, len(candidates))
        async for i, out in parallel_sampling.merge_streams(streams, req.stream_interval):
            check_failed(out, stream=True)
            if not out.delta_text and not out.finished and not out.new_logprobs and not (ids and out.new_token_ids):
                continue
            delta, reason = chat_answer.delta(req, readers[i], out.delta_text, out.finish_reason)
            if delta is None and (hidden or not out.new_logprobs) and not (ids and out.new_token_ids):
                continue  # text a reader holds back
            usage = usage_of(out) if continuous else None
            yield chunk(parallel_sampling.choice_index(candidates[i], req.n),
                        delta or responses.DeltaMessage(content=""), reason, usage,
                        self.logprobs(out.new_token_ids, out.new_logprobs), out.new_token_ids, error=own_error(out))
            if out.finished:
                finals[i] = out
