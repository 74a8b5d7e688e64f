"""kvmesh.replica.openai: the one OpenAI serving layer, shared by the replica and the router. Never imports torch.

The router may import exactly this package from ``replica/`` (tests/test_layering.py and
tests/router/test_no_torch.py enforce it): everything both HTTP fronts do the same way lives here, once.

    config.py     FrontendConfig: body/prompt limits, template trust, read timeouts
    errors.py     ProtocolError, OpenAI-shaped error bodies, the apps' error handlers
    protocol.py   request models (completions, chat, tokenize) -> SamplingParams
    responses.py  response and SSE chunk models, LoadReport
    logprobs_format.py  the engine's per-token logprobs -> vLLM's completion / chat ``logprobs`` objects
    tokenizer.py  torch-free tokenizer loading and the prompt -> token id rules
    renderer.py   PromptRenderer: tokenizing and chat-template rendering off the event loop, with limits
    body.py       reading a JSON body with limits applied while it arrives
    auth.py       the API key (tenants) and the admin key (replica set) on every path that needs them
    routes.py     /tokenize, /v1/*/render, /ping, /version: one implementation for both servers
    runner.py     HTTPServer: uvicorn with header/body read timeouts, in a loop or on its own thread
    metrics_exposition.py  GET /metrics: OpenMetrics / text negotiation, the process collectors
    metric_buckets.py      vLLM's histogram buckets (the replica's and the router's latency histograms)
"""
