"""Testing aids for metastore backends: the conformance kit and the HBase emulator.

Run the kit against any registered backend::

    python -m metastore.testing --uri myscheme://host:port/prefix
"""
