"""The float64 twin's widening, rule by rule, on each side: inside it every float32 a model's code
asks for by hand or gives is float64 (torch: `.float()`, `.to(...)`, `.type(...)`, a `dtype=`
argument, the default dtype, a float32 tensor given to a function, a lookup's rows; JAX: a cast,
an iota, a matmul's preferred type, a literal, inside a jit, a remat, a scan, a while loop and a
cond), a cast below float32 stays what it is, a reinterpreting view, a tensor written into and a
rounding to float32's precision are left alone, and everything is as it was after the block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from mhsa.port_check.readers import jax_widened
from mhsa.port_check.readers.torch.widened import widened

X = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(3, 5)

TORCH_CASTS = {
    ".float()": lambda x: x.float(),
    ".to(torch.float32)": lambda x: x.to(torch.float32),
    ".to(dtype=torch.float32)": lambda x: x.to(dtype=torch.float32),
    ".to('cpu', torch.float32)": lambda x: x.to("cpu", torch.float32),
    ".type(torch.float32)": lambda x: x.type(torch.float32),
    ".type('torch.FloatTensor')": lambda x: x.type("torch.FloatTensor"),
    "softmax(dtype=torch.float32)": lambda x: torch.softmax(x, -1, dtype=torch.float32),
    "arange(dtype=torch.float32)": lambda x: torch.arange(3, dtype=torch.float32),
    "arange(...).float()": lambda x: torch.arange(3).float(),
    "zeros without a dtype": lambda x: torch.zeros(3),
    "new_zeros(dtype=torch.float32)": lambda x: x.new_zeros(3, dtype=torch.float32),
}


@pytest.mark.parametrize("cast", list(TORCH_CASTS))
def test_torch_float32_asked_for_by_hand_is_float64_inside_the_twin_and_float32_after(cast):
    with widened():
        assert TORCH_CASTS[cast](X).dtype == torch.float64
    assert TORCH_CASTS[cast](X).dtype == torch.float32 and torch.get_default_dtype() == torch.float32


def test_torch_casts_below_float32_and_a_reinterpreting_view_stay_what_the_code_asks():
    with widened():
        assert X.to(torch.bfloat16).dtype == torch.bfloat16 and X.half().dtype == torch.float16
        assert X.float().view(torch.int64).dtype == torch.int64  # a float64 twin read as int64: the same bytes
        assert X.to(torch.float32).view(torch.int32).shape == (3, 10)


def test_torch_float32_tensors_given_are_read_as_float64_and_what_is_written_into_stays_itself():
    weight, table = torch.nn.Parameter(torch.linspace(-1, 1, 15).reshape(5, 3)), torch.linspace(0, 1, 5)
    cache, weight.grad = torch.zeros(2, 3), torch.ones(5, 3)
    with widened():
        assert torch.nn.functional.linear(X[:, :3], weight).dtype == torch.float64  # a weight left float32
        picked = torch.nn.functional.embedding(torch.tensor([4, 0]), weight)  # a lookup: the rows it takes, widened
        assert picked.dtype == torch.float64 and torch.equal(picked, weight.detach()[[4, 0]].double())
        assert (X[0, :5] * table).dtype == torch.float64 and table.shape == (5,) and table.dtype == torch.float32
        cache[0] = X[0, :3]  # written into: the tensor itself, its values rounded as the code asks
        cache.add_(1)
        weight.grad = None  # a property set on the parameter itself, not on a copy
        called = []
        weight.register_hook(lambda grad: called.append(grad.dtype))  # a hook on the parameter itself
    assert cache.dtype == torch.float32 and torch.equal(cache[0], X[0, :3].float() + 1) and torch.equal(cache[1], torch.ones(3))
    assert weight.grad is None
    (weight * 2).sum().backward()
    assert called == [torch.float32]


def test_torch_default_dtype_comes_back_when_the_block_raises():
    with pytest.raises(RuntimeError), widened():
        raise RuntimeError("inside the twin")
    assert torch.get_default_dtype() == torch.float32 and torch.zeros(1).float().dtype == torch.float32


def _jax(function, *args):
    """(the program `function` traces to, widened, as text; its value; the value as the code asks) in float64 mode."""
    with jax.enable_x64(True):
        args = [jnp.asarray(np.asarray(arg), jnp.float64) for arg in args]
        closed = jax.make_jaxpr(function)(*args)
        wide = jax_widened.widened(closed, args)
        assert wide is not None
        value = jax.core.eval_jaxpr(wide.jaxpr, wide.consts, *args)[0]
        return str(wide), np.asarray(value), np.asarray(function(*args))


JAX_CASTS = {
    "astype": lambda x: x.astype(jnp.float32) * 3,
    "jnp.asarray": lambda x: jnp.asarray(x, jnp.float32) / 3,
    "convert_element_type": lambda x: jax.lax.convert_element_type(x, jnp.float32) / 3,
    "arange(dtype=float32) and a float32 literal": lambda x: x[0, :3] + jnp.arange(3, dtype=jnp.float32) * jnp.float32(0.1),
    "preferred_element_type": lambda x: jax.lax.dot(x, x.T, preferred_element_type=jnp.float32) / 3,
    "inside a jit": lambda x: jax.jit(lambda a: a.astype(jnp.float32) / 3)(x),
    "inside a remat": lambda x: jax.checkpoint(lambda a: a.astype(jnp.float32) / 3)(x),
    "inside a scan": lambda x: jax.lax.scan(lambda c, row: (c + row.astype(jnp.float32) / 3, c), jnp.zeros(5, jnp.float32), x)[0],
    "inside a while loop": lambda x: jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] / 3, c[1] + 1), (x.astype(jnp.float32), 0))[0],
    "inside a cond": lambda x: jax.lax.cond(x[0, 0] < 0, lambda a: a.astype(jnp.float32) / 3, lambda a: (a * 2).astype(jnp.float32), x),
}


@pytest.mark.parametrize("cast", list(JAX_CASTS))
def test_jax_float32_asked_for_by_hand_is_float64_in_the_widened_program(cast):
    program, value, narrow = _jax(JAX_CASTS[cast], np.linspace(-1, 1, 15).reshape(3, 5))
    assert "f32" not in program and value.dtype == np.float64, program
    np.testing.assert_allclose(value, narrow, atol=1e-6)  # the same computation, rounded less


def test_jax_a_cast_below_float32_and_a_rounding_to_float32s_precision():
    # bfloat16 is the model's precision, kept; reduce_precision to float32's is an upcast's rounding, passed over
    _, value, _ = _jax(lambda x: x.astype(jnp.bfloat16), np.ones(3))
    assert value.dtype == jnp.bfloat16
    _, value, narrow = _jax(lambda x: jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=23), np.array([1 / 3]))
    assert value[0] == 1 / 3 and narrow[0] == np.float32(1 / 3)


def test_jax_widening_is_on_only_inside_its_block_and_gradients_flow_through_the_widened_program():
    assert not jax_widened.active()
    with jax_widened.widening():
        assert jax_widened.active()
    assert not jax_widened.active()
    with jax.enable_x64(True):
        x = jnp.linspace(-1, 1, 5, dtype=jnp.float64)
        closed = jax.make_jaxpr(lambda a: jnp.sum(jnp.tanh(a.astype(jnp.float32)) ** 2))(x)
        wide = jax_widened.widened(closed, [x])
        grad = jax.grad(lambda a: jax.core.eval_jaxpr(wide.jaxpr, wide.consts, a)[0])(x)
        assert grad.dtype == jnp.float64
        np.testing.assert_allclose(grad, 2 * np.tanh(x) * (1 - np.tanh(x) ** 2), rtol=1e-14)


class UsedThrice(torch.nn.Module):
    """A weight read three times: once where a sum's gradient reaches it and another branch as one
    tensor, once in a product, once summed whole (its gradient a broadcast view)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.v, self.w = torch.nn.Parameter(torch.randn(3, 5)), torch.nn.Parameter(torch.randn(3, 5))

    def forward(self, x):
        a = self.v * x + self.w
        return a * self.w + self.w.sum()


def test_torch_a_weight_read_several_times_gets_the_float64_gradient_of_a_float64_copy_exactly():
    import copy

    from mhsa.port_check.core import cotangents
    from mhsa.port_check.core.structure import as_inputs
    from mhsa.port_check.readers.torch import reader as torch_reader

    model, x = UsedThrice(), np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    with torch_reader.float64_twin(model, True) as twin:
        _, widened_grads = torch_reader.run(twin, as_inputs(x), cotangents.reference)
    _, exact = torch_reader.run(copy.deepcopy(model).double(), as_inputs(x.astype(np.float64)), cotangents.reference)
    for name, grad in exact.items():
        assert widened_grads[name].dtype == np.float64 and np.array_equal(widened_grads[name], grad), name
