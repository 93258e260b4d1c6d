"""The choice of the next token (shared/sampling.py) is right for every temperature the command
accepts: a tiny one is the argmax (ties drawn among equally), a moderate one follows
softmax(logits / T), a huge one is uniform; non-finite logits are refused, never turned into id 0."""

import numpy as np
import pytest

from shared.sampling import NonFiniteLogitsError, next_tokens

V = 11


def logits(rows=7, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, V)) * 10  # (rows, V), no ties


@pytest.mark.parametrize("temperature", [1e-308, 1e-300, 5e-324, 1e-30, 1e-6])
def test_a_tiny_temperature_is_the_argmax(temperature):
    scores = logits()
    for seed in range(20):
        chosen = next_tokens(scores, greedy=False, temperature=temperature, rng=np.random.default_rng(seed))
        assert chosen.tolist() == scores.argmax(axis=-1).tolist(), (temperature, seed)


def test_ties_at_a_tiny_temperature_are_drawn_among_equally():
    scores = np.tile([1.0, 5.0, 5.0, 0.0], (4000, 1))  # (4000, 4)
    chosen = next_tokens(scores, greedy=False, temperature=1e-300, rng=np.random.default_rng(0))
    assert set(chosen.tolist()) == {1, 2} and abs((chosen == 1).mean() - 0.5) < 0.03


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_a_moderate_temperature_follows_the_softmax(temperature):
    row = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
    expected = np.exp(row / temperature) / np.exp(row / temperature).sum()
    chosen = next_tokens(np.tile(row, (40000, 1)), greedy=False, temperature=temperature, rng=np.random.default_rng(1))
    frequencies = np.bincount(chosen, minlength=row.size) / chosen.size
    assert np.abs(frequencies - expected).max() < 0.01, (frequencies, expected)


def test_a_huge_temperature_is_uniform():
    chosen = next_tokens(np.tile(logits(1)[0], (44000, 1)), greedy=False, temperature=1e308, rng=np.random.default_rng(2))
    assert np.abs(np.bincount(chosen, minlength=V) / chosen.size - 1 / V).max() < 0.01


class Draws:
    """A generator whose uniform draws are the given values: the ends of [0, 1)."""

    def __init__(self, value):
        self.value = value

    def random(self, shape):
        return np.full(shape, self.value)


@pytest.mark.parametrize("draw", [0.0, np.nextafter(1.0, 0.0)], ids=["0", "1-ulp"])
def test_an_id_of_probability_zero_is_never_drawn_at_either_end_of_the_draws(draw):
    scores = np.array([[-1e9, 3.0, 3.0, -1e9]])  # the first and last ids have probability 0 at T = 1
    assert next_tokens(scores, greedy=False, temperature=1.0, rng=Draws(draw)).tolist() == [1 if draw == 0.0 else 2]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_non_finite_logits_are_refused_naming_the_row(bad, greedy):
    scores = logits(3)
    scores[2, 4] = bad
    with pytest.raises(
        NonFiniteLogitsError, match=r"^the logits of row\(s\) \[2\] hold NaN or infinite values \(the weights overflow\): no token can be chosen$"
    ):
        next_tokens(scores, greedy=greedy, temperature=1.0, rng=np.random.default_rng(0))
