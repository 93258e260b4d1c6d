"""JAX with Flax NNX and optax: the attention block, TinyLM and the copy-task trainer."""
