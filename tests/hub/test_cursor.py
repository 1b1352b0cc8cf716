"""hub.cursor: the mark-delete point and the acked ranges beyond it (pure; hypothesis against a set)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hub.cursor import MAX_PERSISTED_ACK_RANGES, AckCursor


def test_acks_in_any_order_move_the_mark_delete_point_through_ranges() -> None:
    cur = AckCursor(10)
    assert cur.ack(13) and cur.ack(12) and not cur.ack(12)
    assert cur.mark_delete == 10 and cur.persisted_ranges() == [(12, 13)]
    assert cur.ack(11)
    assert cur.mark_delete == 13 and cur.range_count == 0
    assert not cur.ack(5)


def test_stored_ranges_load_and_cumulative_acks_trim_them() -> None:
    cur = AckCursor(10, [(12, 14), (20, 21), (3, 9)])
    assert cur.persisted_ranges() == [(12, 14), (20, 21)]
    assert cur.is_acked(13) and not cur.is_acked(15) and cur.is_acked(7)
    assert cur.ack_through(13)
    assert cur.mark_delete == 14 and cur.persisted_ranges() == [(20, 21)]
    assert AckCursor(10, [(11, 12)]).mark_delete == 12


def test_persisted_ranges_are_bounded_to_the_nearest() -> None:
    cur = AckCursor(0)
    for seq in range(2, 2 * (MAX_PERSISTED_ACK_RANGES + 50), 2):   # one stuck message, every other acked
        cur.ack(seq)
    kept = cur.persisted_ranges()
    assert len(kept) == MAX_PERSISTED_ACK_RANGES and kept[0] == (2, 2)
    assert cur.range_count == MAX_PERSISTED_ACK_RANGES + 49


@given(st.integers(0, 20), st.lists(st.integers(0, 80), max_size=60), st.integers(0, 90))
def test_against_a_plain_set(start: int, acks: list[int], through: int) -> None:
    cur = AckCursor(start)
    model = set(range(start + 1))
    for seq in acks:
        assert cur.ack(seq) == (seq not in model)
        model.add(seq)
    md = 0
    while md + 1 in model:
        md += 1
    assert cur.mark_delete == md
    assert all(cur.is_acked(s) == (s in model) for s in range(100))
    cur.ack_through(through)
    model |= set(range(through + 1))
    reloaded = AckCursor(cur.mark_delete, cur.persisted_ranges())
    assert all(reloaded.is_acked(s) == (s in model) for s in range(100))


@given(st.lists(st.integers(1, 60), max_size=40), st.lists(st.tuples(st.integers(1, 60), st.integers(0, 12)),
                                                           max_size=8))
def test_ack_many_is_ack_of_each_and_counts_the_new_ones(before: list[int], runs: list[tuple[int, int]]) -> None:
    """Runs of consecutive seq ids (a consumer's acks) go in as ranges; mixed, repeated or already acked
    ones one by one: the state and the count are what acking each one does."""
    one, many = AckCursor(3), AckCursor(3)
    for seq in before:
        one.ack(seq)
        many.ack(seq)
    seqs = [s for first, length in runs for s in range(first, first + length)]
    assert many.ack_many(seqs) == sum(one.ack(s) for s in seqs)
    assert (many.mark_delete, many.persisted_ranges()) == (one.mark_delete, one.persisted_ranges())
    assert all(many.is_acked(s) == one.is_acked(s) for s in range(1, 80))


def test_unacked_from_is_true_only_past_every_acked_message() -> None:
    cur = AckCursor(10, [(14, 15)])
    assert not cur.unacked_from(10) and not cur.unacked_from(15) and cur.unacked_from(16)
    assert AckCursor(10).unacked_from(11) and not AckCursor(10).unacked_from(10)
