"""`mhsa heads` (mhsa/heads.py): a flag the model contradicts is refused in one line (exit 2), a
token id beyond any model by the parser with its usage, and a --plot over its own --load file is
refused before anything is written."""

import pytest

from mhsa.cli import main
from shared import weights
from shared.weights import init_weights
from tests.backends import SMALL
from tests.commands import refused


def saved(tmp_path, name="model.safetensors"):
    path = tmp_path / name
    weights.save(path, init_weights(SMALL, 0), SMALL)
    return path


@pytest.mark.parametrize(
    "tokens, message",
    [
        ("1,1,1,1,1,1,1,1", "--tokens gives 8 ids, more than the model's max_len=7"),
        ("11", "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    ],
    ids=["longer than the context", "an id the model lacks"],
)
def test_tokens_the_model_contradicts_are_refused_in_one_line_without_the_usage(capsys, tmp_path, tokens, message):
    assert main(["heads", "--load", str(saved(tmp_path)), "--tokens", tokens]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"mhsa heads: error: {message}\n", err


def test_a_token_id_beyond_int32_is_refused_by_the_parser_in_one_line(capsys, tmp_path):
    err = refused(capsys, "heads", "--load", str(saved(tmp_path)), "--tokens", "99999999999999999999")
    assert err.splitlines()[-1].endswith("expected token ids in [0, 2147483647], got 99999999999999999999")


@pytest.mark.parametrize(
    "command",
    [["heads", "--load", "model.safetensors", "--tokens"], ["generate", "--load", "model.safetensors", "--prompt"]],
    ids=["heads", "generate"],
)
@pytest.mark.parametrize(
    "ids, why",
    [
        ("3,,3", "item 2 of 3 is empty (a stray comma?)"),
        (",3,", "item 1 of 3 is empty (a stray comma?)"),
        ("3,", "item 2 of 2 is empty (a stray comma?)"),
        ("", "no token id"),
        ("3,-1", "item 2 is '-1', not a non-negative integer"),
        ("2.5", "item 1 is '2.5', not a non-negative integer"),
        ("3,\u0661", "item 2 is '\u0661', not a non-negative integer"),
    ],
)
def test_a_list_of_ids_is_parsed_strictly_and_a_bad_item_is_named_in_one_line(capsys, command, ids, why):
    err = refused(capsys, *command, ids)
    flag = command[-1]
    assert err.splitlines()[-1] == (
        f"mhsa {command[0]}: error: argument {flag}: expected comma-separated token ids such as 3,3,3, got {ids!r}: {why}"
    ), err


def test_a_plot_over_its_own_input_is_refused(capsys, tmp_path):
    source = saved(tmp_path, "model.png")
    before = source.read_bytes()
    assert main(["heads", "--load", str(source), "--plot", str(source)]) == 2
    assert "is the input --load" in capsys.readouterr().err
    assert source.read_bytes() == before
