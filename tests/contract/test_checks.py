"""The input checks every backend shares (shared/checks.py), where they are a function of their
own: the trainers' one check of an epoch's batches. The checks of the block's and the model's
input, through every backend: tests/implementations/test_input_checks.py."""

import pytest

from shared import checks
from tests.backends import SMALL, T
from tests.samples import tokens, with_id
from tests.weight_files import exactly

V, L = SMALL.vocab_size, SMALL.max_len


def test_a_run_of_batches_is_checked_as_its_forwards_would_check_it_batch_by_batch():
    """check_batches, the trainers' one check of an epoch: the first bad batch in order is the one
    named, with the message its own forward would give."""
    batches = [(tokens(), tokens()) for _ in range(6)]
    batches[2] = (with_id(V), tokens())
    batches[4] = (with_id(-1), tokens())
    with pytest.raises(ValueError, match=exactly(f"token id {V} is out of range: ids must lie in [0, {V}) for vocab_size={V}")):
        checks.check_batches(batches, V, L)
    batches[1] = (tokens(dtype="float64"), tokens())  # a dtype is refused before any id is read
    with pytest.raises(TypeError, match=exactly("tokens must be an integer array (B, T) of int32 or int64, got dtype float64")):
        checks.check_batches(batches, V, L)
    checks.check_batches([(tokens(), tokens()), (tokens((2, T), "int32"), tokens())], V, L)  # a shorter last batch, int32: fine
