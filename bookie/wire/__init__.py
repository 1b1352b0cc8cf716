"""Wire plumbing shared by the bookie and the hub (a hub may import bookie, never the reverse).

    from bookie.wire import FrameDecoder, encode_frame, FrameBudget, Outbox, TxnTable

* ``framing``: the 4-byte length prefix, ``FrameDecoder`` (split a stream),
  ``encode_frame`` (frame a protobuf message), ``FrameBudget`` (partial
  frames held across all connections of a server);
* ``outbox``: ``Outbox``, a connection's outgoing frames, written together
  once per loop turn;
* ``sockets``: ``set_tcp_liveness``, keepalive and ``TCP_USER_TIMEOUT`` on
  a client's socket (the ledger client's and the hub client's);
* ``txns``: ``TxnTable``, a client connection's outstanding requests by txn
  id (``bookie.protocol.PendingRequests`` and ``hub.protocol.ClientConnection``).

Both are free of protocol decisions; ``bookie.protocol`` and
``hub.protocol`` build on them.
"""

from bookie.wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    LENGTH_PREFIX,
    PREFIX_SIZE,
    FrameBudget,
    FrameDecoder,
    encode_frame,
)
from bookie.wire.outbox import Outbox
from bookie.wire.sockets import set_tcp_liveness
from bookie.wire.txns import TxnTable

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "LENGTH_PREFIX", "PREFIX_SIZE", "FrameBudget", "FrameDecoder", "Outbox",
           "TxnTable", "encode_frame", "set_tcp_liveness"]
