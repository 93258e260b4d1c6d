"""The PyTorch reader: `reader.py` reads a `torch.nn.Module` (parameters, outputs, gradients,
casts), `dataflow.py` follows what each output was computed from while it runs, `training.py`
trains a copy with the user's own `torch.optim` optimizer for `--train`."""
