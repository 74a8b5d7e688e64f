"""SourceTracker: in-order delivery and the recovery decisions, without sockets."""

import time

from kvmesh.events.schema import AllBlocksCleared, BlockRemoved, KVEventBatch
from kvmesh.events.subscribe.tracker import REPLAY, SNAPSHOT, SourceTracker


def batch(tag: int) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=[BlockRemoved(block_hashes=[tag], medium="CPU")], data_parallel_rank=0)


class Harness:
    def __init__(self, has_replay=True):
        self.delivered: list[tuple[int, list]] = []
        self.requests: list[tuple[str, int]] = []
        self.status: list[str] = []
        self.t = SourceTracker(
            "r0",
            deliver=lambda name, seq, b: self.delivered.append((seq, b.events)),
            request=lambda name, kind, start: self.requests.append((kind, start)),
            notify=lambda name, status, detail: self.status.append(status),
            has_replay=has_replay,
        )

    def seqs(self):
        return [s for s, _ in self.delivered]


def test_in_order_batches_are_delivered_at_once():
    h = Harness()
    for s in range(3):
        h.t.on_live(s, batch(s))
    assert h.seqs() == [0, 1, 2] and h.requests == []


def test_a_gap_is_replayed_and_waiting_batches_follow_in_order():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.on_live(3, batch(3))
    h.t.on_live(4, batch(4))
    assert h.requests == [(REPLAY, 1)] and h.seqs() == [0]
    for s in (1, 2, 3):  # the replay overlaps what is waiting
        h.t.on_replay_batch(s, batch(s))
    h.t.on_replay_end()
    assert h.seqs() == [0, 1, 2, 3, 4]
    assert h.t.stats.gaps == 1 and h.t.stats.replays == 1


def test_a_hole_in_the_replay_buffer_falls_back_to_a_snapshot():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.on_live(9, batch(9))
    h.t.on_replay_batch(7, batch(7))  # 1..6 were evicted from the ring buffer
    h.t.on_replay_end()
    assert h.requests[-1] == (SNAPSHOT, 0)
    h.t.on_snapshot_chunk([])
    h.t.on_snapshot_end(next_seq=9)
    assert h.seqs() == [0, 8, 9]
    assert h.delivered[1][1] == [AllBlocksCleared()]
    assert h.t.stats.snapshots == 1


def test_late_joiner_asks_for_a_snapshot_and_skips_what_it_covers():
    h = Harness()
    h.t.start(snapshot_on_start=True)
    assert h.requests == [(SNAPSHOT, 0)]
    h.t.on_live(5, batch(5))
    h.t.on_live(6, batch(6))
    h.t.on_snapshot_end(next_seq=6)
    assert h.seqs() == [5, 6]  # the snapshot (as seq 5), then live batch 6; live 5 is covered


def test_a_snapshot_batch_is_stamped_with_the_time_it_arrived():
    deliveries = []
    t = SourceTracker("r0", deliver=lambda name, seq, b: deliveries.append(b),
                      request=lambda *a: None, notify=lambda *a: None, has_replay=True)
    t.start(snapshot_on_start=True)
    before = time.time()
    t.on_snapshot_end(next_seq=1)
    assert before <= deliveries[0].ts <= time.time()  # consumers measure event lag from ts


def test_a_source_without_snapshots_falls_back_to_replay_from_zero_and_says_so():
    h = Harness()
    h.t.start(snapshot_on_start=True)
    h.t.on_live(2, batch(2))
    h.t.on_request_failed(SNAPSHOT, "no snapshots", unsupported=True)
    assert h.status == ["snapshot_failed"] and h.requests[-1] == (REPLAY, 0)
    h.t.on_replay_batch(0, batch(0))
    h.t.on_replay_batch(1, batch(1))
    h.t.on_replay_end()
    assert h.seqs() == [0, 1, 2] and h.t.stats.snapshot_failures == 1


def test_an_unrecoverable_gap_is_counted_reported_and_skipped():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.snapshot_supported = False
    h.t.on_live(5, batch(5))
    h.t.on_request_failed(REPLAY, "timeout")
    assert h.seqs() == [0, 5]
    assert h.t.stats.unrecovered == 1 and "unrecovered" in h.status


def test_without_replay_endpoint_gaps_are_only_counted():
    h = Harness(has_replay=False)
    h.t.on_live(0, batch(0))
    h.t.on_live(3, batch(3))
    assert h.seqs() == [0, 3] and h.requests == [] and h.t.stats.gaps == 1


def test_a_late_joiner_without_replay_takes_its_first_batch_as_the_baseline():
    # A router started after its replicas, in front of streams without a replay endpoint (vLLM's
    # default): what was published before it listened is unknown, not lost -- no loss is reported.
    h = Harness(has_replay=False)
    h.t.start(snapshot_on_start=True)
    for s in (7, 8, 9):
        h.t.on_live(s, batch(s))
    assert h.seqs() == [7, 8, 9] and h.requests == []
    assert h.status == [] and h.t.stats.unrecovered == 0 and h.t.stats.gaps == 0
    assert h.t.stats.late_joins == 1 and h.t.stats.last_seq == 9
    h.t.on_live(11, batch(11))  # a gap after joining is still counted
    assert h.seqs()[-1] == 11 and h.t.stats.gaps == 1


def test_a_restart_missed_mid_stream_without_replay_is_still_a_loss():
    # Only the first join is free: a router that had a view of the source and missed a new
    # publisher's first batches holds stale blocks, which it must be told about.
    h = Harness(has_replay=False)
    for s in range(6):
        h.t.on_live(s, batch(s))
    h.t.on_live(3, batch(3))  # a new publisher, its batches 0..2 missed
    assert "unrecovered" in h.status and h.t.stats.unrecovered == 1 and h.t.stats.late_joins == 0
    assert h.seqs()[-1] == 3 and h.delivered[-1][1][0] == AllBlocksCleared()


def test_seq_going_back_is_a_restart_that_clears_first():
    h = Harness()
    for s in range(3):
        h.t.on_live(s, batch(s))
    h.t.on_live(0, batch(100))
    assert h.seqs() == [0, 1, 2, 0]
    assert h.delivered[-1][1][0] == AllBlocksCleared()
    assert h.t.stats.restarts == 1


def test_restart_seen_mid_stream_replays_the_new_publishers_start():
    h = Harness()
    for s in range(5):
        h.t.on_live(s, batch(s))
    h.t.on_live(2, batch(102))  # new publisher, its 0 and 1 were missed
    assert h.requests == [(REPLAY, 0)]
    h.t.on_replay_batch(0, batch(100))
    h.t.on_replay_batch(1, batch(101))
    h.t.on_replay_end()
    assert h.seqs()[-3:] == [0, 1, 2]
    assert h.delivered[-3][1][0] == AllBlocksCleared()


def test_all_blocks_cleared_in_the_stream_counts_as_a_restart():
    h = Harness()
    h.t.on_live(0, KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
    assert h.t.stats.restarts == 1 and h.seqs() == [0]


def test_a_reconnect_resyncs_from_a_snapshot():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.on_reconnect()
    assert h.requests == [(SNAPSHOT, 0)]
    h.t.on_snapshot_end(next_seq=7)
    assert h.seqs() == [0, 6] and h.t.stats.reconnects == 1


def test_a_snapshot_request_lost_with_the_old_peer_is_asked_again_after_a_reconnect():
    h = Harness()
    h.t.start(snapshot_on_start=True)
    h.t.on_reconnect()
    h.t.on_request_failed(SNAPSHOT, "timeout")
    assert h.requests == [(SNAPSHOT, 0), (SNAPSHOT, 0)] and h.t.stats.snapshot_failures == 0


def test_an_unanswered_probe_just_resumes_live_delivery():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.probe()
    h.t.on_live(1, batch(1))  # waits while the probe is out
    h.t.on_request_failed(REPLAY, "timeout")
    assert h.seqs() == [0, 1] and h.t.mode == "live" and h.t.stats.unrecovered == 0


def test_a_gap_that_opens_while_a_probe_is_out_is_replayed():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.probe()
    h.t.on_live(2, batch(2))  # 1 was lost after the publisher answered the probe
    h.t.on_replay_end()       # the probe found nothing
    assert h.requests[-1] == (REPLAY, 1)
    h.t.on_replay_batch(1, batch(1))
    h.t.on_replay_end()
    assert h.seqs() == [0, 1, 2] and h.t.stats.snapshots == 0


def _snapshot_joined(h: Harness, next_seq: int) -> None:
    """A late joiner's snapshot through ``next_seq - 1``, its probe answered with nothing newer."""
    h.t.start(snapshot_on_start=True)
    h.t.on_snapshot_end(next_seq=next_seq)
    h.t.on_replay_end()


def test_a_live_batch_the_snapshot_covered_arriving_after_it_is_dropped_not_taken_for_a_restart():
    """A batch published just before the snapshot was taken can reach the SUB socket after the snapshot's answer: it
    is in the snapshot already. Taken for a publisher restart, it cleared the replica's blocks and replayed its whole
    history, whose old timestamps then marked the stream as lagging (routing to it by load only)."""
    h = Harness()
    _snapshot_joined(h, next_seq=25)
    h.t.on_live(23, batch(23))
    h.t.on_live(24, batch(24))
    h.t.on_live(25, batch(25))
    assert h.seqs() == [24, 25] and h.requests == [(SNAPSHOT, 0), (REPLAY, 25)]
    assert h.t.stats.restarts == 0 and h.t.stats.covered_late == 2
    assert AllBlocksCleared() not in h.delivered[-1][1]


def test_a_live_batch_a_replay_covered_arriving_after_it_is_dropped():
    h = Harness()
    h.t.on_live(0, batch(0))
    h.t.on_live(3, batch(3))
    for s in (1, 2, 3):
        h.t.on_replay_batch(s, batch(s))
    h.t.on_replay_end()
    h.t.on_live(2, batch(2))  # delivered late by the socket: the replay had it
    h.t.on_live(4, batch(4))
    assert h.seqs() == [0, 1, 2, 3, 4] and h.t.stats.restarts == 0 and h.t.stats.covered_late == 1


def test_seq_zero_after_a_recovery_or_a_drop_past_the_window_is_still_a_restart():
    h = Harness()
    _snapshot_joined(h, next_seq=25)
    h.t.on_live(0, batch(100))  # a new publisher starts at 0
    assert h.t.stats.restarts == 1 and h.delivered[-1][1][0] == AllBlocksCleared()
    late = Harness()
    late.t.late_copies.window_s = 0.0  # the window has passed: a seq going back is a new publisher again
    _snapshot_joined(late, next_seq=25)
    late.t.on_live(24, batch(124))
    assert late.t.stats.restarts == 1 and late.requests[-1] == (REPLAY, 0)


def test_the_consumer_can_tell_a_replayed_batch_from_a_live_one():
    kinds = []
    t = SourceTracker("r0", deliver=lambda name, seq, b: kinds.append((seq, t.delivering)),
                      request=lambda *a: None, notify=lambda *a: None, has_replay=True)
    t.on_live(0, batch(0))
    t.on_live(3, batch(3))  # 1 and 2 are missing: replayed
    t.on_replay_batch(1, batch(1))
    t.on_replay_batch(2, batch(2))
    t.on_replay_end()
    t.resync()
    t.on_snapshot_end(next_seq=4)
    assert kinds == [(0, "live"), (1, "replay"), (2, "replay"), (3, "live"), (3, "snapshot")]
