"""Generation with a KV cache (shared.protocol, capability "generate"): cached decoding equals
full recomputation at every step in every backend, the caches agree across backends, greedy
ids are identical, the JAX decode step compiles once, and bad requests fail the same way
everywhere before any work. Sizes are tests.backends.SMALL (V=11, D=24, H=4, max_len=7), B=3."""

import re

import numpy as np
import pytest

from mhsa import registry
from mhsa.parity.decode import decode_rows, decode_run
from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.tolerances import assert_close, tolerance
from shared.weights import init_weights
from tests.backends import SMALL, B, names
from tests.tiers import first_fast

GENERATORS = names("generate")
PROMPT = 3  # tokens read in one call before the single-token steps


def sequence(seed=0, shape=(B, SMALL.max_len)):
    return np.random.default_rng(seed).integers(0, SMALL.vocab_size, size=shape)


def build(name, dtype="float32", config=SMALL, seed=0):
    backend = registry.get(name)
    return backend.model.from_exchange(init_weights(config, seed, dtype), config), backend.module("generate")


def exactly(message):
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize("dtype", first_fast(DTYPES))
@pytest.mark.parametrize("name", GENERATORS)
def test_cached_logits_equal_a_full_forward_at_every_step(name, dtype):
    run = decode_run(name, init_weights(SMALL, 1, dtype), SMALL, sequence(), PROMPT)
    assert [logits.shape for logits in run["cached"]] == [(B, PROMPT, 11)] + [(B, 1, 11)] * (SMALL.max_len - PROMPT)
    for step, (cached, full) in enumerate(zip(run["cached"], run["full"])):
        assert_close(f"{name} {dtype} logits at step {step}", cached, full, tolerance("stage", dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_contents_agree_across_backends_at_every_filled_slot(dtype):
    arrays = init_weights(SMALL, 2, dtype)
    runs = {name: decode_run(name, arrays, SMALL, sequence(2), PROMPT) for name in GENERATORS}
    reference, *others = GENERATORS
    for step in range(SMALL.max_len - PROMPT + 1):
        filled = PROMPT + step
        for part in ("k", "v"):
            assert runs[reference][part][step].shape == (B, SMALL.n_heads, filled, SMALL.d_head)
            for other in others:
                assert_close(
                    f"cache {part.upper()} after step {step}, {other} vs {reference}",
                    runs[other][part][step],
                    runs[reference][part][step],
                    tolerance("stage", dtype),
                )


def test_greedy_ids_are_identical_across_backends_and_without_the_cache():
    prompt = sequence(3)[:, :PROMPT]
    results = {}
    for name in GENERATORS:
        model, generate = build(name, seed=3)
        results[name] = generate.generate(model, prompt, SMALL.max_len - PROMPT)
        np.testing.assert_array_equal(
            generate.generate(model, prompt, SMALL.max_len - PROMPT, use_cache=False),
            results[name],
            err_msg=f"{name}: cached and uncached greedy ids differ",
        )
    reference = results[GENERATORS[0]]
    assert reference.shape == (B, SMALL.max_len)
    np.testing.assert_array_equal(reference[:, :PROMPT], prompt)
    for name, ids in results.items():
        np.testing.assert_array_equal(ids, reference, err_msg=f"greedy ids of {name} differ from {GENERATORS[0]}")


@pytest.mark.parametrize("name", GENERATORS)
def test_sampling_with_a_seed_is_reproducible_and_matches_across_cache_modes(name):
    model, generate = build(name, seed=4)
    prompt = sequence(4)[:, :2]
    first = generate.generate(model, prompt, 4, greedy=False, temperature=2.0, seed=5)
    np.testing.assert_array_equal(generate.generate(model, prompt, 4, greedy=False, temperature=2.0, seed=5), first)
    np.testing.assert_array_equal(generate.generate(model, prompt, 4, greedy=False, temperature=2.0, seed=5, use_cache=False), first)


@pytest.mark.parametrize("name", GENERATORS)
def test_chunks_of_any_length_at_any_offset_equal_the_full_forward(name):
    # a chunk of several tokens at offset p > 0 exercises rows p..p+t-1 of the mask with t > 1
    model, generate = build(name, "float64", seed=5)
    tokens = sequence(5)
    full = registry.get(name).model.predict(model, tokens)
    cache = generate.new_cache(model, B)
    start = 0
    for end in (3, 5, 6, 7):  # prefill 3, then a chunk of 2, then single tokens
        assert_close(f"{name} chunk {start}..{end - 1}", generate.step(model, tokens[:, start:end], cache), full[:, start:end], 1e-10)
        start = end
    k, v = generate.cache_arrays(cache)
    assert k.shape == v.shape == (B, SMALL.n_heads, SMALL.max_len, SMALL.d_head)


@pytest.mark.parametrize("name", GENERATORS)
def test_a_prompt_of_max_len_minus_one_tokens_gets_one_more(name):
    model, generate = build(name, seed=6)
    prompt = sequence(6)[:, : SMALL.max_len - 1]
    ids = generate.generate(model, prompt, 1)
    expected = registry.get(name).model.predict(model, prompt)[:, -1].argmax(-1)
    np.testing.assert_array_equal(ids[:, -1], expected)  # one more is refused: BAD_REQUESTS["too long"]


@pytest.mark.parametrize("name", GENERATORS)
def test_rows_of_a_batch_decode_as_if_alone(name):
    model, generate = build(name, "float64", seed=7)
    prompts = sequence(7)[:, :2]
    assert len({tuple(row) for row in prompts}) == B  # different prompts of equal length
    together = generate.generate(model, prompts, 5)
    for row in range(B):
        np.testing.assert_array_equal(
            generate.generate(model, prompts[row : row + 1], 5)[0], together[row], err_msg=f"{name}: row {row} decodes differently inside the batch"
        )


def plant_top_left_mask(monkeypatch, name):
    """The classic port bug, in one backend: a chunk at offset p gets causal_mask[:t, :S]."""
    block = registry.get(name).module("attention").MultiHeadSelfAttention
    allowed = block._allowed
    monkeypatch.setattr(block, "_allowed", lambda self, start, T, S, mask: allowed(self, 0, T, S, mask))


def test_a_planted_top_left_mask_is_named_by_the_decode_rows(monkeypatch):
    planted = names("layers")[0]
    plant_top_left_mask(monkeypatch, planted)
    rows = decode_rows(SMALL, "float64", seed=8, prompt_len=PROMPT)
    failed = [row for row in rows if not row.passed]
    assert failed and failed[0].name.startswith(f"{planted}: cached logits vs its full forward"), [row.name for row in failed]
    assert failed[0].failing_pair() is not None and planted in failed[0].failing_pair()
    assert failed[0].note.startswith(f"decode: {planted} parts from its full forward at step 1 ")  # the prefill at p = 0 is right
    for row in rows:
        if "its full forward" in row.name and not row.name.startswith(planted):
            assert row.passed, f"{row.name} fails although only {planted} was planted"


def test_a_fused_decode_step_given_the_top_left_mask_is_named_by_its_row(monkeypatch):
    # the fused kernel's own mask: is_causal, or rows 0..t-1, on a one-token step at p > 0
    planted = names("fused")[0]
    block = registry.get(planted).module("attention").MultiHeadSelfAttention
    fused = block._fused_attention
    monkeypatch.setattr(block, "_fused_attention", lambda self, q, k, v, mask, start: fused(self, q, k, v, mask, 0))
    failed = [row for row in decode_rows(SMALL, "float32", seed=8, prompt_len=PROMPT, names=[planted]) if not row.passed]
    assert [row.name for row in failed] == [f"{planted} fused: cached logits vs explicit full forward, 5 steps"]
    assert failed[0].note.startswith(f"decode: {planted} fused parts from its full forward at step 1 ")


def test_a_trained_copy_model_continues_the_prompt_with_its_token():
    trainer = registry.get(names("train")[0]).train
    config = ModelConfig()
    history = trainer.train(config, TrainConfig(epochs=1, seed=0))
    arrays = registry.get(names("train")[0]).model.to_exchange(history.model)
    for name in GENERATORS:
        backend = registry.get(name)
        ids = backend.module("generate").generate(backend.model.from_exchange(arrays, config), np.array([[7, 7], [3, 3]]), 6)
        np.testing.assert_array_equal(ids, [[7] * 8, [3] * 8], err_msg=f"{name} does not continue the copy task")


def test_the_jax_decode_step_compiles_once_for_a_fixed_cache_size():
    pytest.importorskip("jax")
    from flax import nnx

    import jax_impl.generate

    config = ModelConfig(vocab_size=13, d_model=20, n_heads=5, max_len=9)  # shapes no other test compiles
    model, generate = build("jax", config=config, seed=9)
    assert generate is jax_impl.generate
    assert not nnx.state(generate.new_cache(model, 2), nnx.Param)  # the cache is state, not a parameter
    compiled = jax_impl.generate._step._cache_size
    before = compiled()
    prompt = np.random.default_rng(9).integers(0, 13, size=(2, 2))
    generate.generate(model, prompt, 7)  # one prefill of 2 tokens, six one-token steps at p = 2..7
    assert compiled() - before == 2
    generate.generate(model, np.concatenate([prompt, prompt[:, :1]], axis=1), 6)  # a new prefill length only
    assert compiled() - before == 3


# --- bad requests: one message in every backend, before any work ----------------------------

BAD_REQUESTS = {
    "too long": (np.zeros((B, 5), np.int64), 3, ValueError, "prompt of 5 tokens plus max_new_tokens=3 is 8 positions, longer than max_len=7"),
    "empty prompt": (
        np.zeros((B, 0), np.int64),
        2,
        ValueError,
        "prompt is empty (shape (3, 0)); expected at least one token id in each of at least one row",
    ),
    "id too large": (np.full((B, 2), 11), 2, ValueError, "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    "negative id": (np.full((B, 2), -1), 2, ValueError, "token id -1 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    "float prompt": (np.zeros((B, 2)), 2, TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype float64"),
    "negative count": (np.zeros((B, 2), np.int64), -1, ValueError, "max_new_tokens must be at least 0, got -1"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=str)
@pytest.mark.parametrize("name", GENERATORS)
def test_bad_requests_fail_the_same_way_everywhere(name, case):
    prompt, count, error, message = BAD_REQUESTS[case]
    model, generate = build(name)
    with pytest.raises(error, match=exactly(message)):
        generate.generate(model, prompt, count)


@pytest.mark.parametrize("name", GENERATORS)
def test_a_wrong_cache_is_refused_before_any_work(name):
    model, generate = build(name)
    tokens = sequence()[:, :2]
    config = SMALL
    module = generate
    small = module.KVCache(B - 1, config.n_heads, config.max_len, config.d_head)
    with pytest.raises(ValueError, match=exactly("KV cache holds a batch of 2 rows, the input has 3")):
        module.step(model, tokens, small)
    wide = module.KVCache(B, config.n_heads, config.max_len, config.d_head, dtype="float64")
    with pytest.raises(TypeError, match=exactly("KV cache dtype float64 does not match the input's float32")):
        module.step(model, tokens, wide)
    cache = module.new_cache(model, B)
    module.step(model, sequence()[:, :6], cache)
    with pytest.raises(ValueError, match=exactly("KV cache holds 6 positions; 2 more would end at 8, longer than max_len=7")):
        module.step(model, tokens, cache)
    k, _ = module.cache_arrays(cache)
    assert k.shape[2] == 6  # the refused chunk wrote nothing
