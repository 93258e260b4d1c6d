"""The Flax reader: `reader.py` reads an NNX module or a Linen (module, variables) pair, `jaxpr.py`
walks its traced program (what it reads, each output's layout), `training.py` trains an NNX port
with the user's optax transformation for `--train`."""
