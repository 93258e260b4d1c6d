"""TinyLM in torch and JAX: converters, the mask as a non-parameter, agreement with numpy_ref."""

import numpy as np
import pytest

from mhsa import registry
from shared import weights
from shared.tolerances import assert_close, stage_kind, tolerance
from shared.trace import STAGES
from shared.weights import init_weights
from tests.backends import ADAPTERS, SMALL, B, T, names

DTYPES = ["float32", "float64"]


def tokens_for(seed=0):
    return np.random.default_rng(seed).integers(0, SMALL.vocab_size, size=(B, T))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exchange_round_trip_is_bit_identical(backend, dtype):
    arrays = init_weights(SMALL, 0, dtype)
    module = backend.backend.model
    back = module.to_exchange(module.from_exchange(arrays, SMALL))
    assert list(back) == list(arrays)
    for name in arrays:
        assert back[name].dtype == arrays[name].dtype and back[name].tobytes() == arrays[name].tobytes(), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding-mask"])
def test_forward_equals_numpy_ref_at_every_stage(autodiff_backend, dtype, masked):
    arrays = init_weights(SMALL, 1, dtype)
    mask = None
    if masked:
        mask = np.ones((B, 1, 1, T), dtype=bool)
        mask[0, ..., 2:] = False
    expected, actual = {}, {}
    ADAPTERS["numpy"].forward(tokens_for(), arrays, SMALL, mask=mask, trace=expected)
    autodiff_backend.forward(tokens_for(), arrays, SMALL, mask=mask, trace=actual)
    assert tuple(actual) == STAGES
    for name in STAGES:
        assert actual[name].dtype == dtype, name
        assert_close(f"{autodiff_backend.name} {name}", actual[name], expected[name], tolerance(stage_kind(name), dtype))


def test_bias_free_model_has_no_bias_anywhere(autodiff_backend):
    from shared.config import ModelConfig

    config = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7, bias=False)
    arrays = init_weights(config, 0, "float64")
    assert not any(name.endswith("bias") for name in arrays)
    expected = ADAPTERS["numpy"].forward(tokens_for(), arrays, config)
    assert_close("logits", autodiff_backend.forward(tokens_for(), arrays, config), expected, 1e-10)


def test_torch_mask_is_a_buffer_not_a_parameter_and_not_saved():
    import torch

    from torch_impl.model import from_exchange, to_exchange

    model = from_exchange(init_weights(SMALL, 0), SMALL)
    assert "attn.causal_mask" not in dict(model.named_parameters())
    assert "attn.causal_mask" in dict(model.named_buffers())
    assert "attn.causal_mask" not in model.state_dict() and "attn.causal_mask" not in to_exchange(model)
    assert model.attn.causal_mask.dtype == torch.bool and not model.attn.causal_mask.requires_grad
    assert sorted(name for name, _ in model.attn.named_parameters()) == [
        "out_proj.bias",
        "out_proj.weight",
        "qkv_proj.bias",
        "qkv_proj.weight",
    ]


def test_jax_mask_is_not_a_param_and_gets_no_gradient():
    import jax.numpy as jnp
    from flax import nnx

    from jax_impl.attention import CausalMask
    from jax_impl.model import from_exchange, loss_fn

    model = from_exchange(init_weights(SMALL, 0), SMALL)
    assert isinstance(model.attn.causal_mask, CausalMask) and not isinstance(model.attn.causal_mask, nnx.Param)
    params = nnx.state(model, nnx.Param)
    assert "causal_mask" not in params["attn"]
    assert sorted(params["attn"]) == ["out_proj", "qkv_proj"]
    grads = nnx.jit(nnx.grad(loss_fn))(model, jnp.asarray(tokens_for()), jnp.asarray(tokens_for()))  # one compilation, not one per operation
    assert "causal_mask" not in grads["attn"]


def test_checkify_catches_an_id_out_of_range_under_the_users_own_jit():
    """docs/DESIGN.md, "Checks under jit": ids are not known while jit traces a call, and the embedding
    lookup gives NaN or another row for one out of range; with model.checkify_ids, model.check in the call and
    checkify.checkify around it, the first bad id becomes an error with the eager call's message, and a batch in range
    gives the very same logits as the unchecked call."""
    from flax import nnx
    from jax.experimental import checkify

    from jax_impl.model import from_exchange, predict

    model = from_exchange(init_weights(SMALL, 0), SMALL)

    @nnx.jit
    def logits_of(model, tokens):
        return model(tokens)

    def checked(tokens):  # the model's call with its check first, as the NumPy-facing functions make it
        model.check(tokens)
        return model(tokens)

    @nnx.jit
    def checked_logits_of(model, tokens):
        return checkify.checkify(checked)(tokens)

    @nnx.jit
    def checked_without_checkify(model, tokens):
        return checked(tokens)

    good = tokens_for(16)
    plain = np.asarray(logits_of(model, good))
    for bad_id in (SMALL.vocab_size, -1):
        bad = good.copy()
        bad[1, 3] = bad_id
        # what the unchecked jitted call gives, silently: NaN for V, the last row's embedding for -1
        silent = np.asarray(logits_of(model, bad))
        wrapped = np.where(bad < 0, SMALL.vocab_size - 1, bad)
        assert np.isnan(silent).any() if bad_id >= 0 else np.array_equal(silent, np.asarray(logits_of(model, wrapped)))
        model.checkify_ids = True
        error, _ = checked_logits_of(model, bad)
        message = rf"^token id {bad_id} is out of range: ids must lie in \[0, {SMALL.vocab_size}\) for vocab_size={SMALL.vocab_size}"
        with pytest.raises(ValueError, match=message):
            error.throw()
        model.checkify_ids = False
    model.checkify_ids = True
    error, logits = checked_logits_of(model, good)
    assert error.get() is None
    np.testing.assert_array_equal(np.asarray(logits), plain)  # the check costs nothing in the numbers
    np.testing.assert_array_equal(predict(model, good), predict(from_exchange(init_weights(SMALL, 0), SMALL), good))  # checked on the host
    with pytest.raises(ValueError, match="checkify.check which was not functionalized"):  # jitted without checkify.checkify
        checked_without_checkify(model, good)


@pytest.mark.parametrize("name", names("layers"))
def test_mask_is_unchanged_by_training(name):
    from shared.config import TrainConfig

    backend = registry.get(name)
    history = backend.train.train(SMALL, TrainConfig(epochs=1, n_sequences=96, lr=0.05))
    np.testing.assert_array_equal(np.asarray(history.model.attn.causal_mask[...]), np.tril(np.ones((SMALL.max_len, SMALL.max_len), dtype=bool)))
    trained = backend.model.to_exchange(history.model)
    assert set(trained) == set(weights.param_shapes(SMALL))  # still exactly the exchange names
    assert not np.array_equal(trained["attn.qkv_proj.weight"], init_weights(SMALL, 0)["attn.qkv_proj.weight"])


def test_save_then_load_reproduces_the_logits_exactly(trainer_backend, tmp_path):
    from shared.config import TrainConfig

    trainer, module = trainer_backend.backend.train, trainer_backend.backend.model
    history = trainer.train(SMALL, TrainConfig(epochs=1, n_sequences=96, lr=0.05))
    path = tmp_path / "trained.safetensors"
    weights.save(path, module.to_exchange(history.model), SMALL)
    arrays, config = weights.load(path)
    assert config == SMALL
    tokens = tokens_for(3)
    before = module.predict(history.model, tokens)
    after = module.predict(module.from_exchange(arrays, config), tokens)
    np.testing.assert_array_equal(after, before)


@pytest.mark.filterwarnings("error")  # NumPy warns of an overflow unless told not to; torch and JAX never do
def test_weights_that_overflow_give_non_finite_outputs_without_a_warning(backend):
    """The same in every backend: the caller names the inf and NaN (mhsa generate refuses them in
    one line, the heatmaps mark them), with no warning printed before it."""
    arrays = {key: value * 1e30 if "qkv" in key else value for key, value in init_weights(SMALL, 10).items()}
    module = backend.backend.model
    model = module.from_exchange(arrays, SMALL)
    logits, attention = module.predict(model, tokens_for(), return_weights=True)
    out, block_attention = module.attend(model, np.full((B, T, SMALL.d_model), 1e30, np.float32), return_weights=True)
    for name, value in (("logits", logits), ("attention", attention), ("attend", out), ("attend's attention", block_attention)):
        assert not np.isfinite(np.asarray(value)).all(), f"{name}: all finite; expected the overflow's inf or NaN"
