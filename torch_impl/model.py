"""TinyLM in PyTorch (embeddings -> attention -> LM head), its loss, its one exchange-format
converter, and the NumPy-facing functions of shared.protocol (predict, attend, loss_and_grads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shared import checks, weights
from shared.config import ModelConfig
from shared.trace import record, tracing
from torch_impl.attention import DTYPES, MultiHeadSelfAttention

if TYPE_CHECKING:  # the cache's module imports this one
    from torch_impl.generate import KVCache


class TinyLM(nn.Module):
    """int tokens (B, T) -> logits (B, T, V). Its state_dict keys are the exchange names."""

    def __init__(self, config: ModelConfig, *, dtype: str = "float32") -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=DTYPES[dtype])
        self.pos_emb = nn.Embedding(config.max_len, config.d_model, dtype=DTYPES[dtype])
        self.attn = MultiHeadSelfAttention(config.d_model, config.n_heads, config.max_len, config.bias, dtype=dtype, attn_impl=config.attn_impl)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.bias, dtype=DTYPES[dtype])

    def check(self, tokens: Any, mask: Any = None, cache: KVCache | None = None) -> None:
        """Refuse a bad call of the model in one line (shared.checks), before any work: integer
        tokens (B, T) with T <= max_len and every id in [0, V) (a min and max of the ids: a host
        sync on a GPU); the cache must fit the chunk; the mask must be boolean and broadcast to
        (B, H, T, S). forward does not call it: the public functions (predict, loss_and_grads,
        generate.step) check their NumPy input with it once, and a trainer checks an epoch's
        batches before its steps; a caller of the model itself calls it first."""
        config = self.config
        checks.check_tokens(tuple(tokens.shape), str(tokens.dtype), config.vocab_size, config.max_len, *checks.id_range(tokens))
        B, T = tokens.shape
        filled = None if cache is None else cache.length
        checks.check_cache_and_mask(B, T, str(self.tok_emb.weight.dtype), config.n_heads, config.max_len, mask, cache, filled)

    def forward(self, tokens: torch.Tensor, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None) -> Any:
        """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, S)).

        With a KV cache (torch_impl.generate.KVCache) the tokens sit at positions p..p+T-1,
        p = cache.length, and the cache is extended by them; S = max_len (T without a cache)."""
        B, T = tokens.shape
        start = 0 if cache is None else cache.length  # p: positions continue after the cached ones

        # 1. embed: token identity plus learned position
        positions = torch.arange(start, start + T, device=tokens.device)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D)
        record(embed=x)

        # 2. attend
        attended = self.attn(x, mask=mask, return_weights=return_weights, cache=cache)
        x, weights = attended if return_weights else (attended, None)  # (B, T, D)

        # 3. read out the next token
        logits = self.lm_head(x)  # (B, T, V)
        record(logits=logits)
        return (logits, weights) if return_weights else logits


def from_exchange(arrays: dict[str, np.ndarray], config: ModelConfig) -> TinyLM:
    """A TinyLM holding the exchange arrays, in their dtype. Everything is checked before
    anything is assigned; torch's layout is the exchange layout, so nothing is transposed."""
    dtype = weights.validate(arrays, config)
    model = TinyLM(config, dtype=dtype)
    model.load_state_dict({name: torch.from_numpy(np.array(value)) for name, value in arrays.items()}, strict=True)
    return model


def to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The model's parameters as exchange arrays (copies, in the model's dtype)."""
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in model.state_dict().items()}


def grads_to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The .grad of every parameter after loss.backward() as exchange arrays."""
    grads = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            raise ValueError(f"parameter {name} has no .grad; expected loss.backward() to have run first")
        grads[name] = parameter.grad.detach().cpu().numpy().copy()
    return grads


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (B, T, V) against int targets (B, T) -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))  # (B * T, V) against (B * T,)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of the next-token logits: x, y int (B, T) -> scalar."""
    logits = model(x, mask=mask)  # (B, T, V)
    return cross_entropy(logits, y)


def _device(model: TinyLM) -> torch.device:
    """Where the model's parameters live: inputs go there, results come back to the host."""
    return next(model.parameters()).device


def predict(
    model: TinyLM, tokens: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False, trace: dict[str, np.ndarray] | None = None
) -> Any:
    """NumPy in, NumPy out: tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T)).
    trace, a dict, receives every stage of shared.trace.STAGES."""
    tokens, mask, device = np.asarray(tokens), _array(mask), _device(model)
    model.check(tokens, mask)  # the call's one check, on the NumPy input, before any conversion
    stages: dict[str, torch.Tensor] = {}
    with tracing(None if trace is None else stages), torch.no_grad():
        result = model(torch.from_numpy(tokens).to(device), mask=_tensor(mask, device), return_weights=return_weights)
    if trace is not None:
        trace.update({name: _numpy(value) for name, value in stages.items()})
    return tuple(_numpy(value) for value in result) if return_weights else _numpy(result)


def attend(model: TinyLM, x: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False) -> Any:
    """NumPy in, NumPy out: the attention block alone, x (B, T, D) -> (B, T, D), or (out, weights)."""
    x, mask, device = np.asarray(x), _array(mask), _device(model)
    model.attn.check(x, mask)  # the call's one check, on the NumPy input, before any conversion
    with torch.no_grad():
        result = model.attn(torch.from_numpy(x).to(device), mask=_tensor(mask, device), return_weights=return_weights)
    return tuple(_numpy(value) for value in result) if return_weights else _numpy(result)


def loss_and_grads(model: TinyLM, tokens: np.ndarray, targets: np.ndarray, *, mask: np.ndarray | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """NumPy in, NumPy out: (loss, d loss / d every exchange array) by autograd."""
    tokens, mask, device = np.asarray(tokens), _array(mask), _device(model)
    model.check(tokens, mask)  # the call's one check, on the NumPy input, before any conversion
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, torch.from_numpy(tokens).to(device), torch.from_numpy(np.asarray(targets)).to(device), mask=_tensor(mask, device))
    loss.backward()
    return float(loss.detach()), grads_to_exchange(model)


def _array(mask):
    # a mask as NumPy (any array-like of bool): checked, then converted once, as the tokens are
    return None if mask is None else np.asarray(mask)


def _tensor(mask, device):
    return None if mask is None else torch.from_numpy(mask).to(device)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    # a copy on the host: a tensor on the CPU shares its memory with .numpy(), which the caller
    # may write to
    return tensor.detach().cpu().numpy().copy()
