"""Lifecycle policies per topic-name prefix (DESIGN.md 6b): validation, prefix matching, the decisions (sans-IO).

    values = parse_policy({"retention_size_mb": 10, "backlog_quota_policy": "producer_exception"})
    values = parse_assignments(["retention_size_mb=10", "message_ttl_seconds=60"])   # the console's form
    table = PolicyTable(Policy.from_conf(hub_conf), {"orders/": values, "orders/eu": {...}})
    p = table.for_topic(b"orders/eu/1")       # a Policy: every key resolved (longest prefix, then the conf)
    doomed = retention_deletes(p, consumed_ledgers, now_ms)   # which consumed ledgers retention lets go
    quota_exceeded(p, backlog_bytes)          # whether a publish meets the backlog quota

No I/O here: the table is kept in the metastore by ``hub.policy_store`` and
applied by the hub (``hub.housekeeping``: retention and TTL on the
consumed-ledger timer; ``hub.persistence``: the backlog quota on publish).

The keys (``POLICY_KEYS``), each an integer unless said otherwise:

* ``message_ttl_seconds`` (>= 0; 0 = never): unconsumed messages older than
  this are acknowledged for every subscription.
* ``retention_time_minutes`` and ``retention_size_mb`` (>= -1): how long
  and how much *consumed* data is kept for readers and seeks. 0 = delete
  once every subscription consumed it (Hedwig's rule); -1 = for ever. A
  consumed ledger is deleted only once **both** limits let it go (each limit
  keeps what it covers): by time, once it is older than
  ``retention_time_minutes``; by size, once the consumed ledgers newer than
  it already hold ``retention_size_mb`` (the newest consumed data is kept
  first). Pulsar deletes when either limit is reached; the contract here is
  the opposite, so a topic keeps at least the last N minutes *and* the last
  M MB of consumed history.
* ``backlog_quota_limit_bytes`` (>= 0; 0 = no quota): the most bytes of
  unconsumed messages (behind the slowest subscription) the topic may hold.
* ``backlog_quota_policy`` (a word): what a publish that finds the backlog
  at or over the limit gets: ``producer_request_hold`` (Pulsar's default:
  it waits for room up to the hub's ``backlog_quota_hold_timeout``, then
  fails with ``BacklogQuotaExceededError``), ``producer_exception`` (fails
  at once with it), ``consumer_backlog_eviction`` (it is stored, and the
  oldest backlog is acknowledged on behalf of the slowest subscriptions
  until the backlog is under the limit again).
* ``compaction_threshold_bytes`` (>= 0; 0 = off): the owner compacts the
  topic (``hub.compaction``) once the bytes stored after its last
  compaction point exceed this.

Matching: for each key, the longest prefix of the topic name (UTF-8) that
sets the key wins; a key no matching prefix sets takes the hub conf's
default of the same name. So ``orders/`` may set a retention and
``orders/eu`` a quota, and ``orders/eu/1`` gets both. The empty prefix
matches every topic.

Failure: ``parse_policy``, ``parse_assignments`` and ``check_prefix`` raise
``PolicyError`` (a ``ValueError``) whose ``key`` names the bad key (or
``"prefix"``), for an unknown key or policy, a non-integer, a value below
its minimum, or a prefix that is not valid UTF-8 or holds ``"\\x00"``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hub.conf import HubConf

__all__ = ["BACKLOG_QUOTA_POLICIES", "CONSUMER_BACKLOG_EVICTION", "INT_KEYS", "POLICY_KEYS", "PRODUCER_EXCEPTION",
           "PRODUCER_REQUEST_HOLD", "ConsumedLedger", "Policy", "PolicyError", "PolicyTable", "check_prefix",
           "eviction_target", "parse_assignments", "parse_policy", "quota_exceeded", "retention_deletes",
           "ttl_expired_through"]

PRODUCER_REQUEST_HOLD = "producer_request_hold"
PRODUCER_EXCEPTION = "producer_exception"
CONSUMER_BACKLOG_EVICTION = "consumer_backlog_eviction"
BACKLOG_QUOTA_POLICIES = (PRODUCER_REQUEST_HOLD, PRODUCER_EXCEPTION, CONSUMER_BACKLOG_EVICTION)

INT_KEYS: dict[str, int] = {          # key -> the least value allowed
    "message_ttl_seconds": 0,
    "retention_time_minutes": -1,
    "retention_size_mb": -1,
    "backlog_quota_limit_bytes": 0,
    "compaction_threshold_bytes": 0,
}
POLICY_KEYS = (*INT_KEYS, "backlog_quota_policy")
MIB = 1024 * 1024


class PolicyError(ValueError):
    """A bad policy: ``key`` names the key at fault (``"prefix"`` for the prefix, ``"body"`` for the whole)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def check_prefix(prefix: str | bytes) -> str:
    """The prefix as text; ``PolicyError("prefix")`` when it is not valid UTF-8 or holds ``"\\x00"``."""
    if isinstance(prefix, bytes):
        try:
            prefix = prefix.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError("prefix", f"prefix {prefix!r} is not valid UTF-8 ({exc.reason})") from None
    if "\x00" in prefix:
        raise PolicyError("prefix", f"prefix {prefix!r} must not hold \\x00")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in prefix):   # a lone surrogate (e.g. from surrogateescape)
        raise PolicyError("prefix", f"prefix {prefix!r} is not valid UTF-8")
    return prefix


def _int_value(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise PolicyError(key, f"{key} must be an integer, not {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise PolicyError(key, f"{key} must be an integer, not {value!r}") from None
    least = INT_KEYS[key]
    if value < least:
        what = "-1 (for ever) or more" if least == -1 else f"{least} or more"
        raise PolicyError(key, f"{key} must be {what}, not {value}")
    return int(value)


def parse_policy(values: Mapping[str, Any]) -> dict[str, int | str]:
    """Check a JSON object of policy keys; the values as stored (ints, the policy word). See ``PolicyError``."""
    if not isinstance(values, Mapping):
        raise PolicyError("body", f"expected a JSON object of policy keys ({', '.join(POLICY_KEYS)})")
    out: dict[str, int | str] = {}
    for key, value in values.items():
        if key == "backlog_quota_policy":
            if not isinstance(value, str) or value.strip().lower() not in BACKLOG_QUOTA_POLICIES:
                raise PolicyError(key, f"unknown backlog_quota_policy {value!r}: the policies are "
                                       f"{', '.join(BACKLOG_QUOTA_POLICIES)}")
            out[key] = value.strip().lower()
        elif key in INT_KEYS:
            out[key] = _int_value(key, value)
        else:
            raise PolicyError(str(key), f"unknown policy key {key!r}: the keys are {', '.join(POLICY_KEYS)}")
    return out


def parse_assignments(words: Iterable[str]) -> dict[str, int | str]:
    """``["KEY=VALUE", ...]`` (the console's ``set policy``) checked as ``parse_policy``."""
    raw: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not key.strip():
            raise PolicyError(key.strip() or word, f"expected KEY=VALUE, not {word!r}")
        raw[key.strip()] = value
    if not raw:
        raise PolicyError("body", f"no KEY=VALUE given: the keys are {', '.join(POLICY_KEYS)}")
    return parse_policy(raw)


@dataclass(frozen=True)
class Policy:
    """Every policy key resolved for one topic (see the module docstring for their meaning)."""

    message_ttl_seconds: int = 0
    retention_time_minutes: int = 0
    retention_size_mb: int = 0
    backlog_quota_limit_bytes: int = 0
    backlog_quota_policy: str = PRODUCER_REQUEST_HOLD
    compaction_threshold_bytes: int = 0

    @classmethod
    def from_conf(cls, conf: HubConf) -> Policy:
        """The defaults: the hub conf keys of the same names."""
        return cls(**{k: getattr(conf, k) for k in POLICY_KEYS})

    def with_values(self, values: Mapping[str, int | str]) -> Policy:
        return Policy(**{**self.to_json(), **values})   # type: ignore[arg-type]

    def to_json(self) -> dict[str, int | str]:
        return {k: getattr(self, k) for k in POLICY_KEYS}

    @property
    def keeps_consumed(self) -> bool:
        """Whether retention keeps any consumed ledger (else Hedwig's rule: delete once consumed)."""
        return self.retention_time_minutes != 0 or self.retention_size_mb != 0


class PolicyTable:
    """The defaults and the stored policies by prefix; ``for_topic`` resolves one topic's ``Policy``."""

    def __init__(self, defaults: Policy, by_prefix: Mapping[str, Mapping[str, int | str]] | None = None) -> None:
        self.defaults = defaults
        self.by_prefix = {p: dict(v) for p, v in (by_prefix or {}).items()}
        self._prefixes = sorted(self.by_prefix, key=len, reverse=True)   # longest first
        self._memo: dict[bytes, Policy] = {}

    def for_topic(self, topic: bytes) -> Policy:
        """Each key from the longest prefix of ``topic`` that sets it, else the default (memoized)."""
        got = self._memo.get(topic)
        if got is not None:
            return got
        name = topic.decode("utf-8", "replace")
        resolved: dict[str, int | str] = {}
        for prefix in self._prefixes:
            if name.startswith(prefix):
                for key, value in self.by_prefix[prefix].items():
                    resolved.setdefault(key, value)
        policy = self.defaults.with_values(resolved) if resolved else self.defaults
        if len(self._memo) > 100_000:
            self._memo.clear()
        self._memo[topic] = policy
        return policy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyTable) and (self.defaults, self.by_prefix) == (other.defaults,
                                                                                       other.by_prefix)

    __hash__ = None   # type: ignore[assignment]


# --- decisions ------------------------------------------------------------------------------------

class ConsumedLedger(Protocol):
    """What retention needs of a ledger every subscription consumed: its size and when it was last written."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def closed_ms(self) -> int: ...


def retention_deletes(policy: Policy, consumed: Sequence[ConsumedLedger], now_ms: int) -> list[int]:
    """The ids of ``consumed`` (oldest first) that retention lets go: each is deleted once both limits allow.

    By time: older (``now_ms - closed_ms``) than ``retention_time_minutes``
    (0: at once; -1: never). By size: the consumed ledgers newer than it hold
    ``retention_size_mb`` or more (0: at once; -1: never). Deletion is from
    the oldest on: the first ledger kept keeps every newer one.
    """
    t, s = policy.retention_time_minutes, policy.retention_size_mb
    if t == -1 or s == -1:
        return []
    limit_ms = t * 60_000
    limit_bytes = s * MIB
    newer = [0] * len(consumed)     # bytes of the consumed ledgers newer than each
    total = 0
    for i in range(len(consumed) - 1, -1, -1):
        newer[i] = total
        total += consumed[i].size_bytes
    out = []
    for i, led in enumerate(consumed):
        by_time = now_ms - led.closed_ms >= limit_ms
        by_size = newer[i] >= limit_bytes
        if not (by_time and by_size):
            break
        out.append(led.ledger_id)
    return out


def ttl_expired_through(policy: Policy, closed_ms: Sequence[tuple[int, int]], now_ms: int) -> int:
    """The last seq id whose messages are older than ``message_ttl_seconds`` (0: none expire).

    ``closed_ms`` lists ``(last seq id, when it was stored)`` of the topic's
    ledgers, oldest first (ledger-level time: every message of a ledger is at
    least as old as the ledger's last write). 0 when nothing expired.
    """
    ttl = policy.message_ttl_seconds
    if ttl <= 0:
        return 0
    through = 0
    for last_seq, when in closed_ms:
        if now_ms - when >= ttl * 1000:
            through = max(through, last_seq)
    return through


def quota_exceeded(policy: Policy, backlog_bytes: int) -> bool:
    """Whether a publish meets a full backlog: a quota is set and the backlog is at or over it."""
    limit = policy.backlog_quota_limit_bytes
    return limit > 0 and backlog_bytes >= limit


def eviction_target(limit: int, first: int, last: int, bytes_after: Callable[[int], int]) -> int:
    """The seq id the slowest subscriptions are acknowledged up to so the backlog is under ``limit`` again.

    ``bytes_after(seq)`` is the backlog left once everything up to ``seq`` is
    consumed (non-increasing); ``first`` is the slowest pointer now, ``last``
    the topic's last seq id. The answer is the least seq id in
    ``first .. last`` whose backlog is below ``limit`` (the oldest backlog
    goes first); 0 when the backlog is already below it (or no quota).
    """
    if limit <= 0 or first >= last or bytes_after(first) < limit:
        return 0
    return bisect.bisect_left(range(first, last + 1), True, key=lambda seq: bytes_after(seq) < limit) + first
