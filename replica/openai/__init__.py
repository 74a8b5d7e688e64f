"""kvmesh.replica.openai: the one OpenAI HTTP layer, shared by the replica and the router. Never imports torch.

It stands on the serving core (``replica/serving/``: tokenizer, sampling params, errors, load report).
The router may import from ``replica/`` exactly these two packages (tests/test_layering.py and
tests/router/test_no_torch.py enforce it): everything both HTTP fronts do the same way lives here, once.

    config.py     FrontendConfig: body/prompt limits, template trust, read timeouts
    errors.py     error handlers of the replica's and the router's apps, request body parsing
    protocol.py   request models (completions, chat, tokenize) -> SamplingParams
    responses.py  response and SSE chunk models
    logprobs_format.py  the engine's per-token logprobs -> vLLM's completion / chat ``logprobs`` objects
    renderer.py   PromptRenderer: tokenizing and chat-template rendering off the event loop, with limits
    body.py       reading a JSON body with limits applied while it arrives
    auth.py       the API key (tenants) and the admin key (replica set) on every path that needs them
    routes.py     /tokenize, /v1/*/render, /ping, /version: one implementation for both servers
    head_limits.py  a request head's bounds (bytes, header lines, target), counted before the parser sees it
    responses_api/  /v1/responses: Responses rendered to chat requests, their answers to Responses, the store
    runner.py     HTTPServer: uvicorn with header/body read timeouts and head bounds, in a loop or on its own thread
    metrics_exposition.py  GET /metrics: OpenMetrics / text negotiation, the process collectors
"""
