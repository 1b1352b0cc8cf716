"""``quire shell``: ledger and bookie administration.

    quire shell listbookies --metastore lmdb://data/metastore
    quire shell listledgers --bookie 127.0.0.1:3181 --conf conf/bk_server.conf
    quire shell ledgermetadata 42 --metastore ...
    quire shell readledger 42 0 9 --metastore ...
    quire shell simpletest --ensemble 3 --write-quorum 2 --ack-quorum 2 --entries 100 --metastore ...
    quire shell bookieinfo 127.0.0.1:3181 --metastore ...
    quire shell recover 127.0.0.1:3181 [127.0.0.1:3184] [--dry-run] --metastore ...
    quire shell decommission 127.0.0.1:3181 --metastore ...

Modules: ``cli`` (arguments, metastore, errors), ``commands`` (one function
per command), ``progress`` (the tqdm bar), ``errors``. Re-replication
(``bookie.rereplication``) and the adapter to the bookie package's lower
layers (``bookie.ops``) live in ``bookie/`` so AutoRecovery workers in a
bookie process share them.
"""

from tools.shell.cli import configure, run

__all__ = ["configure", "run"]
