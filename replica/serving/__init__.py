"""kvmesh.replica.serving: the torch-free serving core the engine and the router both stand on.

No torch and no HTTP framework (tests/test_layering.py): the engine imports it for the detokenizer, the
load report and the metric buckets; the OpenAI HTTP layer (``replica/openai/``) and the router build on it.

    sampling_params.py  SamplingParams: how one request samples and stops
    tokenizer.py        torch-free tokenizer loading and the prompt -> token id rules
    hf_tokenizer.py     HFTokenizer: what kvmesh calls of a Hugging Face tokenizer (a Protocol)
    json_types.py       JSONObject: the named alias for JSON the code does not structure
    chat_template.py    chat templates compiled once, rendered in a sandbox
    detokenizer.py      incremental detokenization with stop strings
    errors.py           ProtocolError and the OpenAI-shaped error body
    load_report.py      LoadReport: the ``GET /load`` row routers poll
    metric_buckets.py   vLLM's histogram buckets (the replica's and the router's latency histograms)
"""
