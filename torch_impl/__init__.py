"""PyTorch: the attention block, TinyLM and the copy-task trainer."""
