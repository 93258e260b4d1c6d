"""A --history file (shared/history.py) is read with every field type- and range-checked: a file
that is not a history is refused in one line naming the field, never half-read."""

import json

import pytest

from shared.config import TrainConfig
from shared.history import History
from tests.backends import SMALL


def edited(tmp_path, **fields):
    """A history file as History.save writes it, with `fields` replaced in its JSON."""
    path = tmp_path / "h.json"
    History("torch", SMALL, TrainConfig(), [1.0], [1.0], 0.1).save(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


@pytest.mark.parametrize(
    "losses, message",
    [
        ([], "losses is empty; expected one loss per step"),
        (None, "losses must be a flat list of numbers"),
        ([[1.0], [2.0]], "losses must be a flat list of numbers"),
        (["1.0"], "losses must be a flat list of numbers"),
    ],
    ids=["empty", "null", "nested", "strings"],
)
def test_losses_that_are_not_numbers_are_refused_in_one_line(tmp_path, losses, message):
    path = edited(tmp_path, losses=losses)
    with pytest.raises(ValueError) as error:
        History.load(path)
    assert str(error.value) == f"history file {str(path)!r}: {message}"


@pytest.mark.parametrize(
    "value, loads",
    [(None, True), (0.05, True), (-1.0, False), (0.2, False), ("2.0", False), (float("nan"), False), ([0.1], False)],
    ids=["null", "within", "negative", "over-seconds", "string", "nan", "list"],
)
def test_a_history_whose_compile_seconds_is_not_a_share_of_its_seconds_is_refused_in_one_line(tmp_path, value, loads):
    path = edited(tmp_path, compile_seconds=value)
    if loads:
        assert History.load(path).compile_seconds == value
        return
    with pytest.raises(ValueError) as error:
        History.load(path)
    assert str(error.value).startswith(f"history file {str(path)!r}: compile_seconds must be null or a number in [0, seconds], got ")
    assert "\n" not in str(error.value)
