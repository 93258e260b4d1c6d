"""The zoo's own guards: the configurations refuse impossible sizes, the converters refuse an array
taken twice or never and an untied output layer, the loaders check every name and shape before
writing anything, and float64 without JAX's x64 switch is refused instead of computed in float32."""

import jax
import numpy as np
import pytest
from flax import nnx

from examples.zoo import convert, gpt2_convert, gpt2_linen, inputs, llama_convert, llama_flax, seq2seq_convert, seq2seq_linen
from examples.zoo.configs import ConvNetConfig, GPT2Config, LlamaConfig, Seq2SeqConfig, ViTConfig
from examples.zoo.convert import linen_variables
from examples.zoo.torch_weights import numpy_state


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LlamaConfig(n_kv_heads=3), "need n_kv_heads | n_heads | d_model"),
        (lambda: LlamaConfig(d_model=36, n_heads=4), "d_head must be even; got 9"),
        (lambda: LlamaConfig(d_ff=0), "LlamaConfig.d_ff must be positive; got 0"),
        (lambda: GPT2Config(n_heads=3), "d_model must be a multiple of n_heads; got 20, 3"),
        (lambda: ViTConfig(height=20), r"the stem's output \(10, 15\) of an image \(20, 30\) must divide into patches of 3"),
        (lambda: ViTConfig(layer_norm_eps=-1e-6), "ViTConfig.layer_norm_eps must be positive"),
        (lambda: Seq2SeqConfig(d_model=20, n_heads=3), "d_model must be a multiple of n_heads; got 20, 3"),
        (lambda: ConvNetConfig(channels=7), "channels must be even; got 7"),
    ],
)
def test_a_configuration_refuses_sizes_the_model_cannot_have(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_converter_refuses_an_array_taken_twice_or_never():
    take = convert.StateDict({"a": np.zeros(2), "b": np.zeros(3)})
    take("a")
    with pytest.raises(ValueError, match="'a' is taken from the state_dict twice"):
        take("a")
    with pytest.raises(ValueError, match="the state_dict has no 'c'"):
        take("c")
    with pytest.raises(ValueError, match="leaves 1 array"):
        take.finish()
    take.finish(unused=["b"])


def test_the_gpt2_converter_refuses_an_output_layer_that_is_not_the_embedding():
    state = numpy_state(gpt2_convert.gpt2_torch.build())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="lm_head.weight differs from transformer.wte.weight"):
        gpt2_convert.to_flax(state)


def test_the_loader_checks_every_name_and_shape_before_writing_anything():
    arrays = llama_convert.to_flax(numpy_state(llama_convert.llama_torch.build()))
    port = convert.abstract(lambda: llama_flax.Llama(llama_flax.TINY, rngs=nnx.Rngs(0)))
    square = "layers.1.self_attn.o_proj.kernel"
    for broken, message in (
        (arrays | {"lm_head.kernel": np.zeros((24, 37))}, "the port has no variable lm_head.kernel"),
        (arrays | {square: np.zeros((24, 25))}, r"gives shape \(24, 25\), the port holds \(24, 24\)"),
        ({k: v for k, v in arrays.items() if k != square}, f"gives no value for {square}"),
    ):
        with pytest.raises(ValueError, match=message):
            convert.load_nnx(port, broken)
        assert isinstance(port.embed_tokens.embedding.get_value(), jax.ShapeDtypeStruct)  # nothing written
    with pytest.raises(ValueError, match=f"gives no value for {square}, which the abstract port holds no value for"):
        convert.load_nnx(port, {k: v for k, v in arrays.items() if k != square}, complete=False)


def test_the_linen_variables_are_checked_against_what_init_would_create():
    module, x, arrays = gpt2_linen.GPT2LMHeadModel(gpt2_linen.TINY), inputs.gpt2(gpt2_linen.TINY), gpt2_convert.reference_arrays()
    with pytest.raises(ValueError, match="gives no value for transformer.ln_f.bias"):
        convert.linen_variables(module, x, {k: v for k, v in arrays.items() if k != "transformer.ln_f.bias"})
    with pytest.raises(ValueError, match=r"transformer.ln_f.bias: the converter gives shape \(21,\), the port holds \(20,\)"):
        convert.linen_variables(module, x, arrays | {"transformer.ln_f.bias": np.zeros(21)})


def test_the_linen_variables_keep_a_converters_leftover_only_where_it_is_said_to_be_unread():
    module, x = seq2seq_linen.Seq2Seq(seq2seq_linen.TINY), inputs.seq2seq(seq2seq_linen.TINY)
    arrays = seq2seq_convert.to_flax(numpy_state(seq2seq_convert.seq2seq_torch.build()))
    assert "embedding" in linen_variables(module, x, arrays, unread=[seq2seq_convert.LEFTOVER])["params"]["encoder"]["embed_tokens"]
    with pytest.raises(ValueError, match="the port has no variable encoder.embed_tokens.embedding"):
        linen_variables(module, x, arrays)
    with pytest.raises(ValueError, match="shared.embedding: said to be unread, but the module creates it"):
        linen_variables(module, x, arrays, unread=["shared.embedding"])


def test_the_seq2seq_converter_refuses_stacks_that_do_not_share_the_embedding():
    state = numpy_state(seq2seq_convert.seq2seq_torch.build())
    state["decoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] + 1.0
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight differs from shared.weight"):
        seq2seq_convert.to_flax(state)


def test_float64_without_jax_x64_is_refused_rather_than_computed_in_float32():
    with jax.enable_x64(False), pytest.raises(ValueError, match="float64 needs jax.config.update"):
        convert.jax_dtype("float64")
    with pytest.raises(ValueError, match="float32 or float64; got 'bfloat16'"):
        convert.jax_dtype("bfloat16")
