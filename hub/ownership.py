"""Topic ownership: lazy claims in ``topic_owners``, redirects, hub liveness and load.

    owners = Ownership(conf, me, TopicOwnershipManager(store), HubRegistry(store), session)
    verdict = await owners.claim(topic, should_claim=False)
    if verdict is None: ...            # this hub owns the topic now
    else: redirect_to = verdict        # "host:port:sslport" of the owner (or of the hub that should claim)

A topic is claimed on its first publish or subscribe. With
``metadata_manager_based_topic_manager_enabled`` off (the default) the
owner record is an ephemeral key of this hub's metastore session (it
vanishes ``zk_timeout`` after the hub dies); with it on, the record is
persistent and written by compare-and-set, and an owner whose registration
in ``hubs`` is gone (or is an older incarnation, by ``czxid``) is replaced
by CAS. An unowned topic goes to the least-loaded live hub: another hub
answers with a redirect there, and the client's retry carries
``shouldClaim`` so that hub claims it.

Failure: metastore errors propagate (the server answers SERVICE_DOWN); so
does a claim while the hub's metastore session is lost (until the
housekeeping timer registers a new one), rather than an ephemeral write on
a dead session.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from hub import errors
from hub.conf import HubConf
from hub.metadata import hub_address
from hub.proto import pubsub_pb2 as pb
from metastore import Version
from metastore.cas import cas_retry
from metastore.idle import KeptVersion, kept_version, version_of

if TYPE_CHECKING:
    from hub.metadata import HubRegistry, TopicOwnershipManager
    from metastore.api import Session

log = logging.getLogger(__name__)

__all__ = ["Ownership", "same_hub"]

_LIVE_CACHE_SECONDS = 0.5
_SENT_MEMORY_SECONDS = 3.0
"""How long a redirect sent to a hub counts toward its load (its own load record catches up within a second)."""
_CLAIM_ATTEMPTS = 5
#: A claim another hub (or a release) got to first: read the owner record again.
_CLAIM_CONFLICTS: tuple[type[Exception], ...] = (errors.BadVersionError, errors.NoTopicOwnerInfoError,
                                                 errors.TopicOwnerInfoExistsError)


def same_hub(a: pb.HubInfo, b: pb.HubInfo) -> bool:
    return (a.hostname, a.port, a.sslPort, a.czxid) == (b.hostname, b.port, b.sslPort, b.czxid)


class Ownership:
    """See the module docstring."""

    def __init__(self, conf: HubConf, me: pb.HubInfo, owners: TopicOwnershipManager, registry: HubRegistry,
                 session: Session) -> None:
        self.conf = conf
        self.me = me
        self.owners = owners
        self.registry = registry
        self.session = session
        self.cas_mode = conf.metadata_manager_based_topic_manager_enabled
        self.versions: dict[bytes, KeptVersion] = {}   # owner record versions of the owned topics (ints)
        self._live: list[tuple[pb.HubInfo, pb.HubLoad]] = []
        self._live_at = 0.0
        self._sent: dict[str, dict[bytes, float]] = {}   # hub address -> unowned topics sent there, and when
        self.num_topics = 0

    async def live_hubs(self) -> list[tuple[pb.HubInfo, pb.HubLoad]]:
        now = time.monotonic()
        if now - self._live_at > _LIVE_CACHE_SECONDS:
            self._live = await self.registry.live_hubs()
            self._live_at = now
        return self._live

    async def _alive(self, info: pb.HubInfo) -> bool:
        if any(same_hub(info, h) for h, _ in await self.live_hubs()):
            return True
        self._live_at = 0.0      # not in the cached list: look again before calling it dead
        return any(same_hub(info, h) for h, _ in await self.live_hubs())

    async def _least_loaded(self, topic: bytes) -> pb.HubInfo:
        """The live hub with the fewest topics, counting the unowned topics just sent to each.

        A topic counts once, however many of its requests were redirected: a
        topic sent to a hub within ``_SENT_MEMORY_SECONDS`` goes there again
        while that hub is live (its claim may still be under way), so two
        clients of one unowned topic never split it over two hubs' counts.
        """
        now = time.monotonic()
        live = await self.live_hubs()
        for sent in self._sent.values():
            for t in [t for t, when in sent.items() if now - when >= _SENT_MEMORY_SECONDS]:
                del sent[t]
        best = self.me
        best_load = self.num_topics
        for info, load in live:
            if same_hub(info, self.me):
                continue
            sent = self._sent.get(str(hub_address(info)), {})
            if topic in sent:
                return info
            if load.numTopics + len(sent) < best_load:
                best, best_load = info, load.numTopics + len(sent)
        if not same_hub(best, self.me):
            self._sent.setdefault(str(hub_address(best)), {})[topic] = now
        return best

    async def claim(self, topic: bytes, should_claim: bool) -> str | None:
        """``None`` once this hub owns ``topic``; else the address to redirect to."""
        if self.session is not None and not self.session.alive:
            # a claim would not outlive the session (the housekeeping timer registers a new one)
            raise errors.ServiceDownError(f"cannot claim {topic!r}: this hub's metastore session is lost; retry")
        try:
            # a lost race reads the owner record again at once (no pause: the winner is known now)
            return await cas_retry(functools.partial(self._claim_once, topic, should_claim),
                                   attempts=_CLAIM_ATTEMPTS, first_delay=0, max_delay=0, retry_on=_CLAIM_CONFLICTS)
        except _CLAIM_CONFLICTS:
            raise errors.ServiceDownError(f"could not settle the owner of {topic!r}") from None

    async def _claim_once(self, topic: bytes, should_claim: bool) -> str | None:
        """One read-and-claim; raises one of ``_CLAIM_CONFLICTS`` when another hub wrote first."""
        got = await self.owners.read_owner_info(topic)
        if got is not None:
            info, version = got
            if same_hub(info, self.me):
                self.versions[topic] = kept_version(version)
                return None
            alive = await self._alive(info)
            if not alive and not self.cas_mode:
                # its ephemeral record outlives it until the lease runs out: not worth a redirect
                raise errors.ServiceDownError(f"owner {hub_address(info)} of {topic!r} is gone; "
                                              f"retry after zk_timeout")
            if not alive:
                self.versions[topic] = kept_version(await self.owners.write_owner_info(topic, self.me, version))
                log.info("claimed %r from dead owner %s", topic, hub_address(info))
                return None
            return str(hub_address(info))
        if not should_claim:
            target = await self._least_loaded(topic)
            if not same_hub(target, self.me):
                return str(hub_address(target))
        session = None if self.cas_mode else self.session
        try:
            self.versions[topic] = kept_version(await self.owners.write_owner_info(topic, self.me, Version.NEW,
                                                                                   session=session))
        except errors.PubSubError:
            if session is not None and not session.alive:
                # the lease lapsed under the claim (a renewal late behind a busy event loop): retryable, as
                # a claim that found the session lost before it started
                raise errors.ServiceDownError(f"cannot claim {topic!r}: this hub's metastore session is not "
                                              f"alive; retry") from None
            raise
        return None

    async def release(self, topic: bytes) -> None:
        """Give ``topic`` up (delete the owner record if it is still ours).

        The live hubs' loads are read again at the next choice: a topic given
        up goes to the least loaded hub as it is now (a hub that joined within
        the cache's half second included), not as it was.
        """
        kept = self.versions.pop(topic, None)
        if kept is None:
            return
        self._live_at = 0.0
        try:
            await self.owners.delete_owner_info(topic, version_of(kept))
        except errors.PubSubError as exc:
            log.info("release of %r: %s", topic, exc)
