"""Moved to ``bookie.wire.outbox`` (the plumbing the bookie and the hub share); kept for its importers."""

from bookie.wire.outbox import Outbox

__all__ = ["Outbox"]
