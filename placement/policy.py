"""The ensemble placement contract.

An ``EnsemblePlacementPolicy`` chooses which bookies hold a ledger and in
which order to read them. The ledger client owns one instance, feeds it
every cluster change and asks it for ensembles::

    dead = policy.on_cluster_changed(writable={"10.0.0.1:3181", ...}, readonly=set())
    ensemble = policy.new_ensemble(3, 2, 2, exclude=set())            # ["host:port", ...]
    spare = policy.replace_bookie(3, 2, 2, ensemble, ensemble[0], exclude=set())
    order = policy.reorder_read_sequence(ensemble, [0, 1], {ensemble[0]: 2})   # [1, 0]

Common rules for every implementation:

* Bookies are ``"host:port"`` strings; read orders are lists of ensemble
  indexes.
* Sizes must satisfy ``1 <= ack_quorum <= write_quorum <= ensemble_size``;
  anything else raises ``ValueError``.
* Read-only and excluded bookies are never returned by ``new_ensemble`` or
  ``replace_bookie``; when the request cannot be met they raise
  ``NotEnoughBookiesError``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from placement.errors import NotEnoughBookiesError

if TYPE_CHECKING:
    from placement.dns import DNSToSwitchMapping

__all__ = ["EnsemblePlacementPolicy", "NotEnoughBookiesError", "check_quorums"]


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise ``ValueError`` unless ``1 <= ack_quorum <= write_quorum <= ensemble_size``."""
    if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
        raise ValueError(
            "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
            f"ensemble_size={ensemble_size} write_quorum={write_quorum} ack_quorum={ack_quorum}"
        )


class EnsemblePlacementPolicy(abc.ABC):
    """Chooses bookies for ensembles and orders bookies for reads."""

    @classmethod
    def from_conf(cls, conf: Mapping[str, str], dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
        """Build a policy from configuration (used by ``placement.build_policy``).

        The default constructs ``cls()`` and calls ``initialize(conf, dns)``;
        policies whose constructor needs arguments override this. Raises
        ``ValueError`` for configuration values that cannot work.
        """
        policy = cls()
        policy.initialize(conf, dns)
        return policy

    def initialize(self, conf: Mapping[str, str], dns: DNSToSwitchMapping | None = None) -> EnsemblePlacementPolicy:
        """Hook called once after construction; returns ``self``. Default: nothing to do."""
        return self

    def uninitialize(self) -> None:
        """Release what ``initialize`` acquired and forget the cluster. Default: nothing."""
        return None

    @abc.abstractmethod
    def on_cluster_changed(self, writable: Iterable[str], readonly: Iterable[str] = ()) -> set[str]:
        """Take the full current membership; return the bookies now considered dead.

        ``writable`` and ``readonly`` are complete sets (not deltas). Never raises
        for unresolvable bookies: they are placed in ``DEFAULT_RACK``.
        """

    @abc.abstractmethod
    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        exclude: Iterable[str] | None = None,
    ) -> list[str]:
        """Choose ``ensemble_size`` distinct writable bookies, none of them in ``exclude``.

        Raises ``NotEnoughBookiesError`` when the cluster cannot provide them
        and ``ValueError`` for impossible sizes.
        """

    @abc.abstractmethod
    def replace_bookie(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        current_ensemble: Sequence[str],
        bookie_to_replace: str,
        exclude: Iterable[str] | None = None,
    ) -> str:
        """Choose a writable bookie to take ``bookie_to_replace``'s place.

        The answer is never in ``exclude`` nor in ``current_ensemble``. Raises
        ``NotEnoughBookiesError`` when no bookie qualifies and ``ValueError``
        for impossible sizes.
        """

    @abc.abstractmethod
    def reorder_read_sequence(
        self,
        ensemble: Sequence[str],
        write_set: Sequence[int],
        failure_history: Mapping[str, int] | None = None,
    ) -> list[int]:
        """Return the indexes of ``write_set`` in the order reads should try them.

        ``failure_history`` maps a bookie to its observed failure count.
        Raises ``IndexError`` for an index outside ``ensemble``.
        """

    def reorder_read_lac_sequence(
        self,
        ensemble: Sequence[str],
        write_set: Sequence[int],
        failure_history: Mapping[str, int] | None = None,
    ) -> list[int]:
        """The read order of ``write_set`` followed by the other ensemble indexes, ascending."""
        order = self.reorder_read_sequence(ensemble, write_set, failure_history)
        seen = set(order)
        order.extend(i for i in range(len(ensemble)) if i not in seen)
        return order
