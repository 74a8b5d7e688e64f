"""OpenAI's Responses API (``/v1/responses``) on the chat completions path, torch-free, for the router and the replica.

A Responses request is rendered to a chat request (the stored conversation of its ``previous_response_id``, its
``instructions``, its input items); the server's own chat path answers it; the chat answer (whole, or its SSE
chunks) becomes a Response (whole, or its ``response.*`` events). Stored responses belong to their tenant.

    request.py      ResponsesRequest: the body, its refused fields, the chat request it becomes
    items.py        input items (messages, function calls and their outputs) -> chat messages
    output.py       a chat answer -> the Response object, its output items and usage
    events.py       a chat stream's chunks -> the ``response.*`` server-sent events, in OpenAI's order
    store.py        ResponseStore: stored responses per tenant, bounded in bytes and age (SQLite, shareable)
    service.py      ResponsesService: create / retrieve / delete, over a server's chat call
"""
