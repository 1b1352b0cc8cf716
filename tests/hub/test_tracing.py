"""hub.tracing without processes: traced messages sharing an entry share its add's trace."""

from __future__ import annotations

from bookie import tracing as bookie_tracing
from hub import tracing
from hub.proto import pubsub_pb2 as pb


def test_traced_messages_of_one_entry_share_its_add_and_untraced_ones_are_left_alone() -> None:
    messages = [pb.Message(body=b"%d" % i) for i in range(4)]
    first, second = tracing.start(messages[1]), tracing.start(messages[3])
    tracing.sent([(m, None) for m in messages], 9, 4)
    assert not tracing.MESSAGES and first.add is second.add is bookie_tracing.WATCHED[(9, 4)]
    assert first.entry == second.entry == (9, 4)
    copy = bookie_tracing.BookieTimes("b:1", 10)
    copy.times[1:] = [11, 12, 13, 14]
    assert first.add is not None
    first.add.bookies.append(copy)
    one, two = tracing.finish(first), tracing.finish(second)   # the first unwatches; both keep the copy
    assert not bookie_tracing.WATCHED
    for got in (one, two):
        assert got.add_sent_ns == 10
        assert [(b.bookie, b.read_ns, b.ack_read_ns) for b in got.bookies] == [("b:1", 11, 14)]
        assert got.hub_read_ns and got.hub_ack_read_ns >= got.hub_read_ns


def test_a_traced_message_that_failed_before_its_entry_is_forgotten() -> None:
    message = pb.Message(body=b"x")
    trace = tracing.start(message)
    tracing.forget(message)
    assert not tracing.MESSAGES and not tracing.finish(trace).bookies
