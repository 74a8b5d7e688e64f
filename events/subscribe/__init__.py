"""kvmesh.events.subscribe: a follower's side of the stream: ``subscriber`` (EventSubscriber) and its I/O thread
(``feed_loop`` over ``feed``, ``source_turns``, ``replay_requests``, ``snapshot_answer``), the guard (``frame_guard``,
``health``), the per-publisher ordering and recovery (``tracker``, ``pending``, ``stats``), the callbacks' types
(``consumer``) and ``conn_bytes``. Imports only the top of ``events``, never ``publish``."""
