"""kvmesh.events: the KV cache event stream (vLLM 0.33 wire format, plus snapshots).

Modules (import what you need; this package imports nothing itself):

- ``schema``      BlockStored / BlockRemoved / AllBlocksCleared / KVEventBatch (msgspec)
- ``codec``       encode_batch (vLLM bytes) / decode_batch (every vLLM dialect); ``peek``, a
                  payload refused by its msgpack headers before it is decoded
- ``wire``        frame layouts: PUB, replay (vLLM) and snapshot (kvmesh) requests and answers
- ``endpoints``   bind-or-connect rules (vLLM's, plus ``bind://`` / ``connect://``), port 0
- ``state``       CachedBlockSet: the set of blocks a stream describes, and its snapshot chains
- ``config``      the events section: PublisherConfig, PublisherSource, SubscriberConfig
- ``publish/``    the replica's side: ZmqEventPublisher (``publisher``) and its I/O thread (``publisher_io``)
- ``subscribe/``  the follower's side: EventSubscriber (``subscriber``, + ``feed_loop``, its I/O thread over
                  ``feed`` (one SUB socket each, read in turns by ``source_turns``) and ``replay_requests``
                  (the DEALERs, ``snapshot_answer``); ``frame_guard`` + ``health``, bad frames, degraded
                  sources and the statuses a consumer hears; ``consumer``, the callbacks' types; ``tracker``,
                  the per-publisher ordering and gap-recovery logic; ``pending``, ``stats``; ``conn_bytes``,
                  what ZeroMQ holds per connection)
- ``curve``       CURVE keys and socket setup (private streams); ``ratelimit``, the token bucket
                  of the publisher's replay/snapshot limits and the guard's budgets

The top modules are shared by both sides and import neither room; the rooms never import each other.
"""
