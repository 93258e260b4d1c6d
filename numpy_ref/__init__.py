"""Pure-NumPy TinyLM over the exchange dict, in the style of picoGPT: the forward reference
(attention.py, model.py), the backward pass by hand (backward.py), Adam (adam.py), generation
with a KV cache (generate.py) and a trainer like the frameworks' (train.py, `python -m
numpy_ref.train`). Import from the modules; the package itself imports nothing, so that
`python -m numpy_ref.train --help` (and Ctrl-C) reach the command line before NumPy loads."""
