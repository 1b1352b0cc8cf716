"""``quire token``: secret keys and signed tokens for hubs with ``authentication_enabled`` (``hub.auth``).

    quire token create-secret-key --output conf/token.key
    quire token create --secret-key conf/token.key --subject orders-app [--expiry 1h]   # prints the token

``--expiry`` is seconds, or a number with ``s``, ``m``, ``h`` or ``d``. Errors are one line on stderr,
exit status 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

__all__ = ["configure", "duration"]

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds of ``30``, ``45s``, ``10m``, ``1h``, ``7d``; ``ArgumentTypeError`` otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 30m, 1h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def configure(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.description = "Make token secret keys and signed tokens (hub authentication)."
    sub = parser.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    k = sub.add_parser("create-secret-key", help="write a new secret key file (mode 0600)")
    k.add_argument("--output", required=True, metavar="FILE", help="the key file to create (never overwritten)")
    t = sub.add_parser("create", help="print a token for a role, signed with the secret key")
    t.add_argument("--secret-key", required=True, metavar="FILE", help="the hubs' token_secret_key file")
    t.add_argument("--subject", required=True, metavar="ROLE", help="the role the token names")
    t.add_argument("--expiry", type=duration, default=None, metavar="DURATION",
                   help="validity, e.g. 3600, 30m, 1h, 7d (default: no expiry)")
    return run


def run(args: argparse.Namespace) -> int:
    from hub.auth import create_secret_key, create_token

    try:
        if args.token_command == "create-secret-key":
            create_secret_key(args.output)
            print(f"secret key written to {args.output}")
        else:
            print(create_token(args.secret_key, args.subject, args.expiry))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"quire token {args.token_command}: {exc}\n")
        return 1
    return 0
