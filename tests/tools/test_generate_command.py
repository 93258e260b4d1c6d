"""`mhsa generate` (mhsa/generate.py): it prints the tokens and the last token's attention, with
and without the KV cache; a tiny --temperature is greedy; a flag the model contradicts is refused
in one line without the usage (exit 2); weights that overflow the logits are refused in one line (exit 2) and
NaN attention weights get the heatmap's NaN mark. Generation itself, in every backend:
tests/implementations/test_generate.py."""

import re

import numpy as np
import pytest

from mhsa import registry
from mhsa.cli import main
from mhsa.generate import attention_row
from mhsa.heatmap import NAN
from shared import weights
from shared.weights import init_weights
from tests.backends import SMALL, names

GENERATORS = names("generate")


def saved(tmp_path, arrays=None):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 10) if arrays is None else arrays, SMALL)
    return path


def overflowing():
    """Finite weights large enough to overflow the scores (1e30 in the QKV projection)."""
    return {key: value * 1e30 if "qkv" in key else value for key, value in init_weights(SMALL, 10).items()}


def test_the_generate_command_prints_the_tokens_and_the_last_tokens_attention(tmp_path, capsys):
    path = saved(tmp_path)
    backend = registry.get(GENERATORS[0])
    expected = backend.module("generate").generate(backend.model.from_exchange(init_weights(SMALL, 10), SMALL), np.array([[4, 4]]), 3)
    argv = ["generate", "--backend", GENERATORS[0], "--load", str(path), "--prompt", "4,4", "--max-new-tokens", "3", "--heatmap-head", "2"]
    for extra in ([], ["--no-cache"]):
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        assert f"tokens:    {','.join(map(str, expected[0]))}\n" in out
        assert "head 2: attention of the last token (position 4) over the context" in out
        assert len([line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d\.\d{3}", line)]) == 5


def test_a_weight_too_small_for_a_bar_ends_its_line_at_its_digits():
    assert attention_row(np.array([0.001, 0.999]), [7, 3]).splitlines() == [
        " pos   id  weight",
        "   0    7   0.001",
        "   1    3   0.999  " + "#" * 40,
    ]


def generated(capsys, *flags):
    assert main(["generate", *flags]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("generated: "))


@pytest.mark.parametrize("temperature", ["1e-308", "1e-300", "5e-324"])
def test_generate_at_a_tiny_temperature_is_greedy_not_id_0(capsys, tmp_path, temperature):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 3), SMALL)
    flags = ["--load", str(path), "--prompt", "4,4", "--max-new-tokens", "5"]
    greedy = generated(capsys, *flags)
    assert greedy != "generated: 0 0 0 0 0"  # the model has a choice other than id 0 to make
    assert generated(capsys, *flags, "--temperature", temperature) == greedy


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompt", "1", "--heatmap-head", "4"], "--heatmap-head 4 is out of range: the model has 4 heads (0..3)"),
        (["--prompt", "11"], "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
        (["--prompt", "4,4", "--max-new-tokens", "6"], "prompt of 2 tokens plus max_new_tokens=6 is 8 positions, longer than max_len=7"),
    ],
    ids=["a head the model lacks", "an id the model lacks", "longer than the context"],
)
def test_a_flag_the_model_contradicts_is_refused_in_one_line_without_the_usage(capsys, tmp_path, flags, message):
    assert main(["generate", "--load", str(saved(tmp_path)), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"mhsa generate: error: {message}\n", err


@pytest.mark.filterwarnings("error")  # a warning printed before the refusal would make it more than one line
def test_generate_refuses_weights_that_overflow_the_logits_in_one_line(capsys, tmp_path):
    path = saved(tmp_path, overflowing())
    assert main(["generate", "--load", str(path), "--prompt", "1,2", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "mhsa generate: error: the logits of row(s) [0] hold NaN or infinite values (the weights overflow): no token can be chosen\n"
    )


@pytest.mark.filterwarnings("error")  # NumPy's overflow warnings are not printed around the heatmap
def test_a_nan_weight_gets_the_heatmaps_nan_mark_not_a_traceback(tmp_path, capsys):
    """Weights that overflow the scores give NaN attention weights; the command prints them as the
    heatmap does (with no new token to choose, nothing is refused)."""
    assert attention_row(np.array([np.nan, 1.0]), [7, 3]).splitlines()[1] == f"   0    7     nan  {NAN}"
    path = saved(tmp_path, overflowing())
    argv = ["generate", "--backend", GENERATORS[0], "--load", str(path), "--prompt", "1,2", "--max-new-tokens", "0", "--heatmap-head", "0"]
    assert main(argv) == 0
    assert f"     nan  {NAN}" in capsys.readouterr().out
