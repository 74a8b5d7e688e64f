"""Admission in the router: who may send what now, and who waits, by priority and fair share.

A pure policy core, no I/O, no clock of its own (every time is passed in: the HTTP router passes
``time.monotonic()``, the simulator its simulated time), no HTTP library:

    config.py      ``AdmissionConfig``, the router's ``admission`` section
    tenants.py     tenants: the keys file (API key -> tenant, default priority, token-rate limit) or the ``user``
    fair_share.py  the virtual token counter: prompt tokens computed x1, output x2, decayed
    rate_limit.py  the token bucket of a tenant's token-rate limit
    ledger.py      where per-tenant usage and buckets live (``TenantLedger``: one process, ``LocalLedger``)
    shared_ledger.py  the same in shared memory, for ``router.workers`` > 1 (``SharedLedger``)
    shared_waiting.py  its part counting each tenant's waiting requests and owed places per model
    queue.py       the bounded queue of one model: priority first, then the tenant with the least usage
    queue_share.py each tenant's share of a full queue's places: who is refused, whose place an arrival takes
    room.py        whether a replica can start a request soon (predicted TTFT, else its free slots)
    decisions.py   ``Admission``: arrive -> shed at once (429 + Retry-After + reason) | wait | go; leave
"""
