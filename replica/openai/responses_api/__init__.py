"""OpenAI's Responses API (``/v1/responses``) on the chat completions path, torch-free, for the router and the replica.

A Responses request is rendered to a chat request (the stored conversation of its ``previous_response_id``, its
``instructions``, its input items); the server's own chat path answers it; the chat answer (whole, or its SSE
chunks) becomes a Response (whole, or its ``response.*`` events). Stored responses belong to their tenant.

    request.py      ResponsesRequest: the body, its refused fields, the chat request it becomes
    items.py        input items (messages, function calls and their outputs) -> chat messages
    output.py       a chat answer -> the Response object, its output items and usage
    events.py       a chat stream's chunks -> the ``response.*`` server-sent events, in OpenAI's order
    store.py        ResponseStore: the interface of stored responses per tenant, bounded in bytes and age
    open_store.py   open_store: the store a router's ``responses`` section names (above store.py and the databases)
    store_config.py ResponsesStoreConfig: where they live (a SQLite file in the state directory, or a PostgreSQL DSN)
    sql_store.py    the bounds, written once in portable SQL
    sqlite_store.py SQLite: in memory, or a file every router process of a host shares (WAL)
    postgres_store.py  PostgreSQL for routers on several hosts (psycopg pool)
    migrations.py   the tables, versioned; created and migrated by kvmesh
    service.py      ResponsesService: create / retrieve / delete, over a server's chat call
"""
