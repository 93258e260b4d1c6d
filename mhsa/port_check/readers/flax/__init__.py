"""The Flax reader: `reader.py` reads an NNX module or a Linen (module, variables) pair (its traced
program walked by ../jaxpr.py), `training.py` trains an NNX port
with the user's optax transformation for `--train`."""
