"""The copy task: shapes, the copy property, determinism of the batch stream."""

import numpy as np
import pytest

from shared.data import batches, copy_task


def test_rows_repeat_one_id():
    rows = copy_task(n_sequences=50, seq_len=5, vocab_size=11, seed=0)
    assert rows.shape == (50, 6) and rows.dtype == np.int64
    assert (rows == rows[:, :1]).all()
    assert rows.min() >= 0 and rows.max() < 11
    assert len(np.unique(rows[:, 0])) > 5  # ids really vary


def test_batches_shift_by_one_and_cover_every_row_each_epoch():
    rows = copy_task(n_sequences=10, seq_len=5, vocab_size=1000, seed=1)
    stream = list(batches(rows, batch_size=4, epochs=2, seed=2))
    assert [x.shape for x, _ in stream] == [(4, 5), (4, 5), (2, 5)] * 2  # nothing dropped
    for x, y in stream:
        assert x.dtype == np.int64 and (x == y).all()  # copy task: target equals input
    first_epoch = np.concatenate([x[:, 0] for x, _ in stream[:3]])
    assert sorted(first_epoch) == sorted(rows[:, 0])


def test_same_seed_same_stream_other_seed_differs():
    rows = copy_task(64, 5, 11, seed=0)
    a = [x for x, _ in batches(rows, 8, 2, seed=3)]
    b = [x for x, _ in batches(rows, 8, 2, seed=3)]
    c = [x for x, _ in batches(rows, 8, 2, seed=4)]
    assert all((p == q).all() for p, q in zip(a, b))
    assert not all((p == q).all() for p, q in zip(a, c))
    assert (copy_task(64, 5, 11, seed=0) == rows).all()
    assert not (copy_task(64, 5, 11, seed=1) == rows).all()


def test_epochs_are_reshuffled():
    rows = copy_task(64, 5, 1000, seed=0)
    stream = list(batches(rows, 64, 2, seed=0))
    assert not (stream[0][0] == stream[1][0]).all()


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_sizes(bad):
    with pytest.raises(ValueError, match=rf"n_sequences must be a positive integer, got {bad}"):
        copy_task(bad, 5, 11, 0)
    with pytest.raises(ValueError, match=rf"batch_size must be a positive integer, got {bad}"):
        next(batches(copy_task(4, 5, 11, 0), bad, 1, 0))
