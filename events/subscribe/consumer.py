"""What a subscriber's consumer is handed: each source's batches in seq order, and news of the source.

``EventSubscriber(on_batch=..., on_status=...)`` (subscriber.py) passes these down to its I/O loop
(feed_loop.py), its guard (frame_guard.py) and every source's ``SourceTracker`` (tracker.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kvmesh.events.schema import KVEventBatch

BatchCallback = Callable[[str, int, KVEventBatch], None]
"""``on_batch(source_name, seq, batch)``: where batches go, in seq order (the subscriber's consumer)."""
StatusCallback = Callable[[str, str, str], None]
"""``on_status(source_name, status, detail)``: what a consumer hears about a source (health.py names them)."""
