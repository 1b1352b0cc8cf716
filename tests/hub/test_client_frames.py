"""The client's hand-framed PUBLISH requests (``hub.frames.publish_batch``) are byte for byte protobuf's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hub.frames import publish_batch
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode


def protobuf_request(txn: int, topic: bytes, bodies: list[bytes]) -> bytes:
    """What ``encode`` gives for the request the client would build with protobuf (``_bodies_request``)."""
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
    pub = req.publishRequest
    pub.SetInParent()
    pub.topic = topic
    if len(bodies) == 1:
        pub.msg.SetInParent()
        pub.msg.body = bodies[0]
    else:
        for body in bodies:
            pub.msgs.add(body=body)
    return encode(req)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 2**64 - 1), st.binary(max_size=200),
       st.lists(st.binary(max_size=300) | st.sampled_from([b"", b"x" * 127, b"y" * 128, b"z" * 20000]),
                min_size=1, max_size=5))
def test_a_hand_framed_publish_is_what_protobuf_serializes(txn: int, topic: bytes, bodies: list[bytes]) -> None:
    assert publish_batch(txn, topic, bodies) == protobuf_request(txn, topic, bodies)
    assert publish_batch(txn, topic, bodies) == protobuf_request(txn, topic, bodies)   # from the kept leads too
