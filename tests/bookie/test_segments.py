"""``bookie.segments``: checkpoints of any shape read back as a plain dict of entries would."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import lmdb
import pytest

from bookie.segments import PUT_BATCH, SLICE, SegmentStore

KEY = struct.Struct(">QQ")


@pytest.mark.parametrize("seed", range(4))
def test_checkpoints_in_slices_match_a_dict(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 30, max_dbs=4)
    store = SegmentStore(env)
    model: dict[bytes, bytes] = {}
    ledgers = [1, 2, 7, (1 << 63) - 1]
    try:
        for rnd in range(4):
            batch: dict[bytes, bytes] = {}
            for ledger in ledgers:  # ascending runs, interleaved ledgers, spanning several slices
                start = rng.randrange(0, 3 * SLICE)
                for eid in range(start, start + rng.randrange(1, 2 * SLICE)):
                    batch[KEY.pack(ledger, eid)] = b"%d:%d:%d" % (rnd, ledger, eid)
            rewrites = rng.sample(sorted(model), min(len(model), 500)) if model else []
            for key in rewrites:  # out of order: recovery adds over stored segments
                batch[key] = b"again %d" % rnd
            items = list(batch.items())
            head = items[: len(items) // 3]
            rng.shuffle(head)  # some insertion disorder
            items[: len(head)] = head
            entries = dict(items)
            skip = {rng.choice(ledgers)} if rnd == 3 else set()
            with env.begin(write=True) as txn:
                store.write(txn, entries, skip)
            model.update((k, v) for k, v in entries.items() if KEY.unpack(k)[0] not in skip)
        with env.begin(buffers=True) as txn:
            assert store.count(txn) == len(model)
            for key in rng.sample(sorted(model), 3000):
                assert store.read(txn, *KEY.unpack(key)) == model[key]
            for ledger in ledgers:
                mine = [KEY.unpack(k)[1] for k in model if KEY.unpack(k)[0] == ledger]
                last = store.last_entry(txn, ledger)
                assert (last[0] if last else None) == (max(mine) if mine else None)
            _assert_segments_disjoint(txn, store)   # segments of one ledger never overlap
    finally:
        env.close()


@pytest.mark.parametrize("seed", range(3))
def test_checkpoints_of_many_ledgers_with_few_entries_match_a_dict(tmp_path: Path, seed: int) -> None:
    """Many ledgers with an entry or a few each (the new segments put together, more than ``PUT_BATCH``) mixed with
    runs that fall inside or against stored segments (merged): every entry reads back, segments never overlap."""
    rng = random.Random(seed)
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 30, max_dbs=4)
    store = SegmentStore(env)
    model: dict[bytes, bytes] = {}
    ledgers = range(1, PUT_BATCH * 2 + 50)
    next_id = dict.fromkeys(ledgers, 0)
    try:
        for rnd in range(5):
            entries: dict[bytes, bytes] = {}
            for ledger in ledgers:
                if rng.random() < 0.2:
                    continue
                if rnd and rng.random() < 0.1:   # back inside what is stored (a recovery add)
                    first = rng.randrange(0, next_id[ledger] + 1)
                else:
                    first = next_id[ledger]
                count = rng.choice((1, 1, 2, 3, 40))
                for eid in range(first, first + count):
                    entries[KEY.pack(ledger, eid)] = b"%d:%d:%d" % (rnd, ledger, eid)
                next_id[ledger] = max(next_id[ledger], first + count)
            with env.begin(write=True) as txn:
                store.write(txn, entries)
            model.update(entries)
        with env.begin(buffers=True) as txn:
            assert store.count(txn) == len(model)
            for key, value in model.items():
                assert store.read(txn, *KEY.unpack(key)) == value
            _assert_segments_disjoint(txn, store)
    finally:
        env.close()


def _assert_segments_disjoint(txn: lmdb.Transaction, store: SegmentStore) -> None:
    """Every stored segment's first key is at most its last, and below the next segment's first."""
    spans = []
    for key, value in txn.cursor(db=store.segments):
        (n,) = struct.unpack_from(">I", value, 0)
        spans.append((bytes(key), bytes(value[4 + 16 * (n - 1):4 + 16 * n])))
    for (a_first, a_last), (b_first, _) in itertools.pairwise(spans):
        assert a_first <= a_last < b_first
