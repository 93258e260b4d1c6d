"""The backend protocol: what a backend package (numpy_ref, torch_impl, jax_impl, or a new
one) provides, written once. `mhsa.registry` lists the packages and what each
supports; `tests/architecture/test_protocol.py` checks every registered backend against this page.

A backend is a package of modules named below. Framework types stay inside; every
function named "NumPy in, NumPy out" takes and returns NumPy arrays, so a tool can drive any
backend without knowing its framework. B batch, T sequence length, D d_model, H heads,
V vocab_size, d_head = D // H.

Checks run once per call, at its boundary: the NumPy-facing functions check the NumPy arrays
they are given in their first line (model.check, model.attn.check), a trainer checks an epoch's
ids before its steps, and the forwards themselves are the math alone (a caller of a layer or a
TinyLM on the framework's arrays calls its public check(...) first). A mask is any array-like
of bool (NumPy, nested lists, the framework's array), converted once where the call enters;
anything else is refused with shared.checks' one message.

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
    train(model_config, train_config, init="shared", on_step=None, resume=None, on_epoch=None, device="cpu") -> History
                             the copy task on shared.training's batch stream, on one device;
                             init is "shared", "native" or a weights file; resume an AdamState;
                             on_step(step, loss) after each run of steps; on_epoch(epochs_done,
                             model, optimizer) after every epoch's last step, epochs_done counted
                             over the whole run, with the live objects that to_exchange and
                             optimizer_to_exchange take, valid only during the call (mhsa's
                             train command keeps the last complete epoch for Ctrl-C with them);
                             device "cuda" only where the registry lists "device" (checked first
                             by shared.training.check_device; refused before any work where the
                             framework sees no GPU). Data parallel is parallel.train's.
    optimizer_to_exchange(optimizer, model, train_config) -> AdamState
    optimizer_from_exchange(adam_state, optimizer, model) -> None

`train` and `model`, where the registry lists "train_check" (a trainer whose Adam is a
torch.optim optimizer or an nnx.Optimizer over optax: mhsa parity builds from these the run the
port check through training compares step by step)
    train.new_optimizer(model, train_config)
                             the Adam train() builds, with train_config's lr, betas and eps.
    model.cross_entropy(logits, targets) -> scalar
                             loss_fn's loss of logits (B, T, V) against int targets (B, T).

`generate`, where the registry lists "generate"
    The cache contract: K and V of shape (B, H, max_len, d_head), zeros where not yet filled,
    plus `length` = p, the count of filled positions. TinyLM(tokens, cache=cache) reads a
    chunk of T tokens at positions p..p+T-1: pos_emb rows p..p+T-1, the chunk's K and V written
    into slots p..p+T-1, its queries attending to all max_len slots through rows p..p+T-1 of the
    full causal mask (bottom-right aligned, never causal_mask[:T, :T]); the attention weights
    are then (B, H, T, max_len). Cached logits equal a full forward over the whole prefix
    within shared.tolerances. The cache is state, not a parameter: never trained, never saved.
    KVCache(batch, n_heads, max_len, d_head, *, dtype="float32")
                             .k, .v (B, H, max_len, d_head); .length; update(k, v) writes
                             k, v (B, H, T, d_head) at .length and returns the whole K and V.
    new_cache(model, batch) -> KVCache
                             empty, sized and typed for the model.
    step(model, tokens, cache) -> logits
                             NumPy in, NumPy out: tokens (B, T) at positions cache.length..
                             -> logits (B, T, V); extends the cache. Refuses a cache of another
                             batch size or dtype, or one without room for T more positions.
    cache_arrays(cache) -> (k, v)
                             the filled slots as NumPy, (B, H, length, d_head) each.
    generate(model, prompt, max_new_tokens, *, greedy=True, temperature=1.0, seed=0, use_cache=True)
                             NumPy in, NumPy out: prompt int (B, P) -> (B, P + max_new_tokens),
                             the prompt and its continuation. The prompt goes in as one chunk
                             (prefill), then one token per step; use_cache=False recomputes the
                             whole prefix per token. The loop and the choice of tokens are
                             shared.sampling.generate's, in NumPy,
                             so that equal logits give equal tokens in every backend. Refused
                             before any work (shared.checks.check_generate): an empty prompt,
                             ids out of range, P + max_new_tokens > max_len.
`compiled`, where the registry lists "compile" (an opt-in compiler of the training step)
    compile_step(model, optimizer, batches, loss_fn) -> (step, seconds)
                             the whole training step (forward, backward, Adam's update) as one
                             compiled graph, compiled on the first batch of each shape in
                             `batches` and put back as it was; step(x, y) -> the loss before the
                             update, as train.train_step returns it. train(..., compile=True)
                             uses it.
`device`, where the registry lists "device" (the run on an accelerator)
    resolve(name) -> device  the framework's device for "cpu" or "cuda" (its first GPU);
                             ValueError naming the framework's view where it sees no GPU.
    full_precision()         context manager: float32 matmuls at full precision (TF32 off,
                             JAX's "highest"), restored on exit: runs compared across backends.
    accelerator() -> str | None
                             the accelerator the framework computes on by default, or None
                             on a CPU (a parity report then says it turned TF32 off).
`parallel`, where the registry lists "dp" (data parallel on the framework's own engine)
    train(model_config, train_config, dp, init="shared", on_step=None, resume=None, *, shard=shard) -> History
                             the data-parallel twin of train.train: every global batch
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
    "train_check": {"train": ("new_optimizer",), "model": ("cross_entropy",)},  # what mhsa parity builds a port check's training run from
    "fused": {},  # ModelConfig(attn_impl="fused") calls a fused attention kernel
    "jit": {},  # calls are compiled for each new input shape: tests keep such a backend to a few shapes
    "generate": {"generate": ("KVCache", "new_cache", "step", "cache_arrays", "generate")},
    "dp": {"parallel": ("train", "shard", "prepare")},  # data parallel: parallel.train(..., dp=N) over N ranks/devices
    "device": {"device": ("resolve", "full_precision", "accelerator")},  # train(..., device="cpu" | "cuda") (shared.training.DEVICES)
    "compile": {"compiled": ("compile_step",)},  # train(..., compile=True): an opt-in compiler (every JAX run is compiled anyway)
}
