"""Ledger-client configuration: ``LedgerClientConf`` (alias ``ClientConf``) on ``metastore.conf``.

    conf = load_client_conf("conf/bk_client.conf")        # {key: value} for BookKeeper.connect(conf=...)
    bk = await BookKeeper.connect(uri, conf=conf)
    LedgerClientConf.from_mapping({"add_entry_timeout": "5"})   # the client's own keys; placement keys pass through

``conf/bk_client.conf`` lists every key with its default and a comment:
``render_client_conf()`` renders ``LedgerClientConf`` and ``placement.PlacementConf``
(whose keys are ``PLACEMENT_KEYS``) and a test checks the file and the
dataclasses agree. The placement keys are checked here and handed to
``placement.build_policy``.

Failure: an unknown key or a bad value raises ``ConfError`` (a
``bookie.errors.BKError`` and a ``ValueError``) whose one-line message
names the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bookie import protocol
from bookie.errors import ConfError
from metastore.conf import ConfError as BaseConfError
from metastore.conf import conf_keys, parse_conf, read_properties, render_conf, setting
from placement import PLACEMENT_KEYS, PlacementConf

__all__ = [
    "ADD_REQUEST_HEADROOM",
    "PLACEMENT_KEYS",
    "ClientConf",
    "LedgerClientConf",
    "client_keys",
    "load_client_conf",
    "render_client_conf",
]

ADD_REQUEST_HEADROOM = 1024
"""Bytes of an ADD_ENTRY frame beyond the entry body (entry header, digest, request fields)."""

@dataclass(frozen=True)
class LedgerClientConf:
    """Ledger-client settings (the keys of ``conf/bk_client.conf`` other than placement's)."""

    add_entry_timeout: float = setting(
        1.5, "Seconds a bookie may leave adds outstanding without answering any: then it counts as failed "
             "(ensemble change, or delay_ensemble_change), its connection is dropped and it is quarantined. A "
             "bookie that keeps answering, however slowly (fsync or link latency), is not failed. 1.5 s keeps "
             "the stall a cut-off bookie causes under 2 s and is far above a loaded bookie's add latency; "
             "BookKeeper's addEntryTimeoutSec.", min=0.001)
    add_entry_quorum_timeout: float = setting(
        10.0, "Seconds an add may wait for its ack quorum, ensemble changes included, before it fails to the "
              "application with bookie.errors.TimeoutError (and, entries completing in order, every later add "
              "too); keep it well above add_entry_timeout; 0 = never. BookKeeper's addEntryQuorumTimeoutSec.",
        min=0)
    read_entry_timeout: float = setting(5.0, "Seconds a read waits for one bookie.", min=0.001)
    speculative_read_timeout_ms: int = setting(
        500, "After this many milliseconds without an answer a read also asks the next replica; 0 = never.", min=0)
    connect_timeout: float = setting(2.0, "Seconds to wait for a TCP connection to a bookie.", min=0.001)
    tcp_user_timeout: float = setting(
        2.0, "Seconds data sent to a bookie may stay unacknowledged by its host before the connection is dropped "
             "(TCP_USER_TIMEOUT, also bounds keepalive probes): a cut-off host's connection fails in about this "
             "long even with no add outstanding; 0 = the system default (minutes).", min=0)
    tcp_keepalive_interval: float = setting(
        1.0, "Seconds of idleness before a TCP keepalive probe, and between probes, on bookie connections "
             "(SO_KEEPALIVE); 0 = no keepalive.", min=0)
    bookie_watch_interval_ms: int = setting(1000, "How often (ms) the client re-reads the bookie registrations.",
                                            min=1)
    read_window: int = setting(64, "Entries read concurrently by LedgerHandle.read(first, last).", min=1)
    max_frame_size: int = setting(protocol.DEFAULT_MAX_FRAME_SIZE, "Largest frame accepted from a bookie, in bytes.",
                                  min=1024)
    max_entry_size: int = setting(
        protocol.DEFAULT_MAX_FRAME_SIZE - ADD_REQUEST_HEADROOM,
        "Largest entry body an add accepts, in bytes; larger adds fail with EntryTooLargeError "
        "(keep it under the bookies' max_frame_size less 1024).", min=1)
    explicit_lac_interval: int = setting(
        1000, "Milliseconds without an add after which a ledger writer sends its LAC to the bookies, so tailing "
              "readers see its last entry (BookKeeper's explicitLacInterval); 0 disables.", min=0)
    delay_ensemble_change: bool = setting(
        False, "A failed bookie whose loss still leaves every write set its ack quorum does not stop adds: the "
               "writer keeps writing to the rest of the ensemble and replaces the bookie once a replacement exists "
               "(BookKeeper's delayEnsembleChange).")
    bookie_quarantine_time_s: float = setting(
        3.0, "Seconds a bookie that failed an add or a read is left out of new ledgers' ensembles, and of "
             "replacements while other bookies are available (BookKeeper's bookieQuarantineTime; a dead bookie "
             "stays registered up to its session_timeout); 0 = never.", min=0)
    ledger_id_block_size: int = setting(
        1000, "Ledger ids this client reserves at once, with one metastore write (bookie.idgen): hundreds of "
              "ledgers created together (a hub taking its topics over) never contend for the id record. "
              "Ids a stopped client left unused are a gap, never reused.", min=1)
    failure_half_life_s: float = setting(
        60.0, "Seconds after which a bookie's read/add failure count (read ordering) is halved.", min=0.001)

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any] | None, *, source: str = "client conf") -> LedgerClientConf:
        """The client's keys of ``conf`` (strings or typed values); placement keys are skipped.

        Raises ``ConfError`` naming the key for a bad value or a key that
        belongs to neither the client nor placement.
        """
        items = dict(conf or {})
        own = {k: v for k, v in items.items() if k not in PLACEMENT_KEYS}
        try:
            parse_conf(PlacementConf, {k: v for k, v in items.items() if k in PLACEMENT_KEYS}, source=source)
            return parse_conf(cls, own, source=source)
        except BaseConfError as exc:
            raise ConfError(str(exc)) from None
        except ValueError as exc:  # PlacementConf's own checks name the key
            raise ConfError(f"{source}: {exc}") from None


ClientConf = LedgerClientConf
"""The name ``bookie.client`` and its callers have used; ``LedgerClientConf`` says what it configures."""


def load_client_conf(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a ledger-client conf file (``conf/bk_client.conf``) for ``BookKeeper.connect(conf=...)``.

    Returns the keys with a non-empty value. Raises ``ConfError`` naming the
    key for an unknown key or a bad value (or when the file cannot be read).
    """
    try:
        props = read_properties(path)
    except BaseConfError as exc:
        raise ConfError(str(exc)) from None
    LedgerClientConf.from_mapping(props, source=os.path.basename(path))
    return {k: v for k, v in props.items() if v != ""}


def client_keys() -> frozenset[str]:
    """Every key a client conf may hold (the client's and the placement policy's)."""
    return frozenset(conf_keys(LedgerClientConf)) | PLACEMENT_KEYS


_HEADER = """Quire ledger client configuration (BookKeeper.connect(uri, conf=load_client_conf(path))).
Every key is listed with its default. An unknown key or a bad value is a ConfError naming it.
Generated from bookie.client_conf.render_client_conf(); a test checks they agree."""

def render_client_conf() -> str:
    """The text of ``conf/bk_client.conf``: every ``LedgerClientConf`` key, then every placement key."""
    return (render_conf(LedgerClientConf, _HEADER) + "\n"
            + render_conf(PlacementConf, "--- placement (placement.PlacementConf) ---"))
