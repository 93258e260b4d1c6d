"""The port-check zoo: real architectures written by the team in PyTorch and in Flax, each a
faithful port with a converter of its own, plus planted classic porting bugs, so that `mhsa
port-check` can be proven on models it was not written around.

| family | what it has | torch | Flax | converter | bugs |
|---|---|---|---|---|---|
| llama | RMSNorm, rotary, SwiGLU, GQA, tied, causal + padding mask | llama_torch | llama_flax (NNX) | llama_convert | llama_bugs |
| gpt2 | Conv1D (in, out), positions (1, T, D), tanh GELU, tied, dataclass output | gpt2_torch | gpt2_flax, gpt2_linen | gpt2_convert | gpt2_bugs |
| vit | conv stem, BatchNorm in eval, patch embedding, transformer blocks, head | vit_torch | vit_flax (NNX) | vit_convert | vit_bugs |

catalog.py lists every faithful pair and every bug as `package.module:function` factories (each
returns (model, inputs)), with the module where a port check must find each bug; survey.py runs
`mhsa port-check` over all of them (`python -m examples.zoo.survey`). The models are tiny, with odd
distinct sizes (configs.py), except configs.gpt2_small(), GPT-2 small's shape, for benchmarks
(gpt2_torch.small, gpt2_flax.small).

    mhsa port-check examples.zoo.gpt2_torch:reference examples.zoo.gpt2_bugs:attention_scale --dtype float64
"""
