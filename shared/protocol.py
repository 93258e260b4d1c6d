"""The backend protocol: what a backend package (numpy_ref, torch_impl, jax_impl, or a new
one) provides, written once. `shared.tools.registry` lists the packages and what each
supports; `tests/test_protocol.py` checks every registered backend against this page.

A backend is a package with up to three modules. Framework types stay inside; every
function named "NumPy in, NumPy out" takes and returns NumPy arrays, so a tool can drive any
backend without knowing its framework. B batch, T sequence length, D d_model, H heads,
V vocab_size, d_head = D // H.

`attention`, where the registry lists "layers" (numpy_ref's block is the pure function
numpy_ref.attention.attention over the exchange dict)
    MultiHeadSelfAttention(d_model, n_heads, max_len, bias=True, *, dtype="float32", attn_impl="explicit", ...)
                             the block: (B, T, D) -> (B, T, D), or (out, weights (B, H, T, T))
                             with return_weights=True; mask True = may attend, broadcastable
                             to (B, H, T, T), ANDed with the causal mask.

`model` (every backend)
    TinyLM(config, ...)      int tokens (B, T) -> logits (B, T, V), or (logits, weights).
    from_exchange(arrays, config) -> TinyLM
                             the exchange dict (PyTorch layout, shared.weights) in, validated
                             before anything is assigned.
    to_exchange(model) -> dict[str, np.ndarray]
    loss_fn(model, x, y, mask=None) -> scalar
                             mean cross-entropy of the next-token logits, framework-native
                             (what the backend's autodiff differentiates).
    predict(model, tokens, *, mask=None, return_weights=False, trace=None)
                             NumPy in, NumPy out: calling the model. trace, a dict, receives
                             every stage of shared.trace.STAGES as a NumPy array.
    attend(model, x, *, mask=None, return_weights=False)
                             NumPy in, NumPy out: the model's attention block alone.

`model`, where the registry lists "grads"
    grads_to_exchange(grads) -> dict[str, np.ndarray]
    loss_and_grads(model, tokens, targets, *, mask=None) -> (float, dict[str, np.ndarray])
                             NumPy in, NumPy out: the loss and d loss / d every exchange array.

`train`, where the registry lists "train"
    train(model_config, train_config, init="shared", on_step=None, resume=None, dp=1) -> History
                             the copy task on shared.training's batch stream; init is "shared",
                             "native" or a weights file; resume an AdamState; dp > 1 only
                             where the registry lists "dp".
    optimizer_to_exchange(optimizer, model, train_config) -> AdamState
    optimizer_from_exchange(adam_state, optimizer, model) -> None

`parallel`, where the registry lists "dp" (data parallel on the framework's own engine)
    train(model_config, train_config, dp, init="shared", on_step=None, resume=None, *, shard=shard) -> History
                             what train.train(..., dp=dp) delegates to: every global batch
                             (B, T) split into dp equal shards (B // dp, T), one per rank or
                             device, gradients averaged, one Adam step per global batch: the
                             single-device run's mathematics, so its trajectory within the
                             trajectory tolerances. Same seed and init on every rank. The
                             History holds ordinary single-device objects (checkpoints load
                             with any dp, in any backend). ValueError/TypeError before any
                             work (shared.training.check_data_parallel); a failed rank stops
                             every rank and raises shared.training.RankFailedError.
    shard(x, rank, dp)       x (..., B, T) -> rank's rows (..., B // dp, T).
    prepare(dp)              what must happen before the framework starts (JAX on CPU: ask XLA
                             for dp host devices); call it before the first framework use.
"""

from __future__ import annotations

# module -> the names it must define; capability -> extra names it brings
REQUIRED = {
    "model": ("TinyLM", "from_exchange", "to_exchange", "loss_fn", "predict", "attend"),
}
CAPABILITIES = {
    "layers": {"attention": ("MultiHeadSelfAttention",)},
    "grads": {"model": ("grads_to_exchange", "loss_and_grads")},
    "train": {"train": ("train", "optimizer_to_exchange", "optimizer_from_exchange")},
    "fused": {},  # ModelConfig(attn_impl="fused") calls a fused attention kernel
    "dp": {"parallel": ("train", "shard", "prepare")},  # data parallel: train(..., dp=N) over N ranks/devices
}
