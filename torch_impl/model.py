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
from shared.trace import record
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
        # True only while torch_impl.train has checked every id of the epoch it feeds: the forward
        # then skips its own min/max of the ids (a host sync per step)
        self.ids_checked = False

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
        trace: dict[str, Any] | None = None,
        cache: KVCache | None = None,
    ) -> Any:
        """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, S)).

        With a KV cache (torch_impl.generate.KVCache) the tokens sit at positions p..p+T-1,
        p = cache.length, and the cache is extended by them; S = max_len (T without a cache)."""
        checks.check_tokens(
            tuple(tokens.shape),
            str(tokens.dtype),
            self.config.vocab_size,
            self.config.max_len,
            *((None, None) if self.ids_checked else _id_range(tokens)),
        )
        B, T = tokens.shape
        start = 0 if cache is None else cache.length  # p: positions continue after the cached ones
        if cache is not None:
            checks.check_cache(B, str(self.tok_emb.weight.dtype), cache.k.shape[0], str(cache.k.dtype), start, T, self.config.max_len)

        # 1. embed: token identity plus learned position
        positions = torch.arange(start, start + T, device=tokens.device)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D)
        record(trace, "embed", x)

        # 2. attend
        attended = self.attn(x, mask=mask, return_weights=return_weights, trace=trace, cache=cache)
        x, weights = attended if return_weights else (attended, None)  # (B, T, D)

        # 3. read out the next token
        logits = self.lm_head(x)  # (B, T, V)
        record(trace, "logits", logits)
        return (logits, weights) if return_weights else logits


def _id_range(tokens):
    # the smallest and largest id, so that a bad id is named instead of failing deep inside
    if tokens.numel() == 0 or str(tokens.dtype).removeprefix("torch.") not in checks.TOKEN_DTYPES:
        return None, None
    return int(tokens.min()), int(tokens.max())


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


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of the next-token logits: x, y int (B, T) -> scalar."""
    logits = model(x, mask=mask)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))  # (B * T, V) against (B * T,)


def _device(model: TinyLM) -> torch.device:
    """Where the model's parameters live: inputs go there, results come back to the host."""
    return next(model.parameters()).device


def predict(
    model: TinyLM, tokens: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False, trace: dict[str, np.ndarray] | None = None
) -> Any:
    """NumPy in, NumPy out: tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T))."""
    inner: dict[str, torch.Tensor] | None = {} if trace is not None else None
    device = _device(model)
    with torch.no_grad():
        result = model(torch.from_numpy(np.asarray(tokens)).to(device), mask=_tensor(mask, device), return_weights=return_weights, trace=inner)
    if trace is not None and inner is not None:
        trace.update({name: value.cpu().numpy() for name, value in inner.items()})
    return tuple(value.cpu().numpy() for value in result) if return_weights else result.cpu().numpy()


def attend(model: TinyLM, x: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False) -> Any:
    """NumPy in, NumPy out: the attention block alone, x (B, T, D) -> (B, T, D), or (out, weights)."""
    x = np.asarray(x)  # checked before conversion: torch.from_numpy refuses some dtypes (bfloat16) in its own words
    checks.check_input(x.shape, x.dtype.name, model.attn.d_model, model.attn.max_len, str(model.attn.qkv_proj.weight.dtype))
    device = _device(model)
    with torch.no_grad():
        result = model.attn(torch.from_numpy(x).to(device), mask=_tensor(mask, device), return_weights=return_weights)
    return tuple(value.cpu().numpy() for value in result) if return_weights else result.cpu().numpy()


def loss_and_grads(model: TinyLM, tokens: np.ndarray, targets: np.ndarray, *, mask: np.ndarray | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """NumPy in, NumPy out: (loss, d loss / d every exchange array) by autograd."""
    model.zero_grad(set_to_none=True)
    device = _device(model)
    x, y = torch.from_numpy(np.asarray(tokens)).to(device), torch.from_numpy(np.asarray(targets)).to(device)
    loss = loss_fn(model, x, y, mask=_tensor(mask, device))
    loss.backward()
    return float(loss.detach()), grads_to_exchange(model)


def _tensor(mask, device):
    return None if mask is None else torch.from_numpy(np.asarray(mask)).to(device)
