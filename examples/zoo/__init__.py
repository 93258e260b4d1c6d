"""The port-check zoo: real architectures written by the team in PyTorch and in Flax, each a
faithful port with a converter of its own, plus planted classic porting bugs, so that `mhsa
port-check` can be proven on models it was not written around.

| family | what it has | torch | Flax | converter | bugs |
|---|---|---|---|---|---|
| llama | RMSNorm, rotary, SwiGLU, GQA, tied, causal + padding mask | llama_torch | llama_flax (NNX) | llama_convert | llama_bugs |
| gpt2 | Conv1D (in, out), positions (1, T, D), tanh GELU, tied, dataclass output | gpt2_torch | gpt2_flax, gpt2_linen | gpt2_convert | gpt2_bugs |
| vit | conv stem, BatchNorm in eval, patch embedding, transformer blocks, head | vit_torch | vit_flax (NNX) | vit_convert | vit_bugs |
| seq2seq | enc-dec, shared embedding (*), scaled (**), LayerNorm at init | seq2seq_torch | seq2seq_linen (Linen) | seq2seq_convert | seq2seq_bugs |
| convnet | C = H = W = 8, weight-normed conv, sinusoidal position table | convnet_torch | convnet_flax (NNX) | convnet_convert | convnet_bugs |

(*) one embedding module used by both stacks; the converter leaves an unread encoder.embed_tokens
beside shared, as real converters do. (**) by sqrt(d_model), inside torch's embedding module and
after Flax's nn.Embed: one computation split at another module boundary.

catalog.py lists every faithful pair and every bug as `package.module:function` factories (each
returns (model, inputs)), with the module where a port check must find each bug; survey.py runs
`mhsa port-check` over all of them (`python -m examples.zoo.survey`). The models are tiny, with odd
distinct sizes (configs.py; tables.py builds the deterministic tables), except
configs.gpt2_small(), GPT-2 small's shape, for benchmarks (gpt2_torch.small, gpt2_flax.small).

    mhsa port-check examples.zoo.gpt2_torch:reference examples.zoo.gpt2_bugs:attention_scale --dtype float64
"""
