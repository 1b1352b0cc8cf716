"""Errors raised by the placement package.

Placement raises exactly one domain error; everything else is a plain
``ValueError`` for arguments or configuration that can never work::

    try:
        ensemble = policy.new_ensemble(3, 2, 2)
    except NotEnoughBookiesError:
        ...  # too few writable bookies (or racks, when enforced) right now
"""

from __future__ import annotations


class PlacementError(Exception):
    """Base of every placement error; ``code`` names the condition (BookKeeper style)."""

    code = "PlacementException"


class NotEnoughBookiesError(PlacementError):
    """The cluster cannot satisfy the request right now.

    Raised by ``new_ensemble`` when fewer usable bookies exist than the
    ensemble needs (or, with rack enforcement, when the racks cannot give
    every write quorum two racks), and by ``replace_bookie`` when no bookie
    qualifies as a replacement. Retrying after the cluster changes may succeed.
    """

    code = "NotEnoughBookiesException"
