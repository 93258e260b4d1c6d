"""Example model pairs for `mhsa port-check` (README, "Check your own port"): a standard
pre-LayerNorm transformer block written once in PyTorch (torch_block.py) and once in Flax,
NNX and Linen (flax_block.py), and this project's TinyLM; each file's factories return
(model, example inputs) as `mhsa port-check` expects."""
