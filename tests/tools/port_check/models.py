"""Small torch models and their Flax ports, written the way other people write models (not the way
the port check was built): outputs that are dicts, dataclasses, a library's ModelOutput or
tuples holding None and ints; keyword inputs; position embeddings computed once for the batch;
layers with a compute dtype of their own; names that differ. Each pair is faithful unless a
planted bug is asked for by name. The functions at the end are factories for the command."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import linen as nn
from flax import nnx

from examples import flax_block, torch_block

B, T, D, V = 3, 5, 24, 11  # odd, distinct sizes


def activations(seed: int = 0) -> np.ndarray:
    """(B, T, D) float32."""
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype(np.float32)


def token_ids(seed: int = 0) -> np.ndarray:
    """(B, T) int64 ids in [0, V)."""
    return np.random.default_rng(seed).integers(0, V, (B, T))


# --- position embeddings: once for the batch (1, T, D) in torch, per row (B, T, D) in Flax ---


class TorchPositions(torch.nn.Module):
    """ids (B, T) -> (B, T, D): token + position embeddings, then an MLP with exact GELU."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(V, D)
        self.wpe = torch.nn.Embedding(T, D)
        self.fc = torch.nn.Linear(D, 2 * D)
        self.act = torch.nn.GELU()
        self.proj = torch.nn.Linear(2 * D, D)

    def forward(self, ids):
        positions = self.wpe(torch.arange(ids.shape[1])[None])  # (1, T, D): one row for the whole batch
        return self.proj(self.act(self.fc(self.wte(ids) + positions)))  # (B, T, D)


class FlaxPositions(nnx.Module):
    """The same in NNX, position embeddings looked up per row; bug="gelu": the tanh GELU."""

    def __init__(self, bug: str = ""):
        rngs = nnx.Rngs(0)
        self.wte = nnx.Embed(V, D, rngs=rngs)
        self.wpe = nnx.Embed(T, D, rngs=rngs)
        self.fc = nnx.Linear(D, 2 * D, rngs=rngs)
        self.proj = nnx.Linear(2 * D, D, rngs=rngs)
        self.bug = bug

    def __call__(self, ids):
        positions = self.wpe(jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))  # (B, T, D)
        return self.proj(jax.nn.gelu(self.fc(self.wte(ids) + positions), approximate=self.bug == "gelu"))  # (B, T, D)


# --- structured outputs and keyword inputs ---


class ModelOutput(OrderedDict):
    """A stand-in for a library's ModelOutput: an OrderedDict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TorchLayer(torch.nn.Module):
    """(B, T, D) -> (hidden, None, 3): a layer that returns a tuple mixing a tensor, None and an int."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(D, D)

    def forward(self, x, mask=None):
        hidden = torch.tanh(self.dense(x))
        if mask is not None:
            hidden = hidden * mask[..., None]
        return hidden, None, 3


class TorchStructured(torch.nn.Module):
    """forward(x, *, mask=None, scale=1.0) -> ModelOutput(logits, hidden_states=(h1, h2), extras={count, ids})."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([TorchLayer(), TorchLayer()])
        self.head = torch.nn.Linear(D, V)

    def forward(self, x, *, mask=None, scale=1.0):
        h1, _, _ = self.layers[0](x, mask)
        h2, _, count = self.layers[1](h1, mask)
        logits = self.head(h2) * scale
        return ModelOutput(logits=logits, hidden_states=(h1, h2), extras={"count": count, "ids": logits.argmax(-1)})


@dataclasses.dataclass
class FlaxOutput:
    logits: jax.Array
    hidden_states: tuple
    extras: dict


class FlaxLayer(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x, mask=None):
        hidden = jnp.tanh(self.dense(x))
        if mask is not None:
            hidden = hidden * mask[..., None]
        return hidden, None, 3


class FlaxStructured(nnx.Module):
    """The same in NNX, returning a dataclass; bug="mask": the mask inverted in the second layer."""

    def __init__(self, bug: str = ""):
        rngs = nnx.Rngs(0)
        self.layers = nnx.List([FlaxLayer(rngs), FlaxLayer(rngs)])
        self.head = nnx.Linear(D, V, rngs=rngs)
        self.bug = bug

    def __call__(self, x, *, mask=None, scale=1.0):
        h1, _, _ = self.layers[0](x, mask)
        h2, _, count = self.layers[1](h1, ~mask if self.bug == "mask" else mask)
        logits = self.head(h2) * scale
        return FlaxOutput(logits=logits, hidden_states=(h1, h2), extras={"count": count, "ids": logits.argmax(-1)})


class LinenStructured(nn.Module):
    """The same in Linen, returning a dict of a tuple."""

    @nn.compact
    def __call__(self, x, *, mask=None, scale=1.0):
        hidden = []
        for i in range(2):
            x = jnp.tanh(nn.Dense(D, name=f"layers_{i}_dense")(x)) * mask[..., None]
            hidden.append(x)
        return {"logits": nn.Dense(V, name="head")(x) * scale, "hidden_states": tuple(hidden)}


def keyword_inputs() -> dict:
    """Keyword inputs: x, a boolean mask (B, T) and a Python float."""
    mask = np.random.default_rng(1).random((B, T)) > 0.3
    return {"x": activations(), "mask": mask, "scale": 0.5}


# --- compute dtypes of their own ---


class LinenFixedDtype(nn.Module):
    """Linen MLP whose first Dense computes in a fixed dtype whatever the parameters' (a library's habit)."""

    compute: str = "float32"
    eps: float = 1e-5

    def setup(self):
        self.norm = nn.LayerNorm(epsilon=self.eps)
        self.fc1 = nn.Dense(2 * D, dtype=jnp.dtype(self.compute))
        self.fc2 = nn.Dense(D)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(self.norm(x)), approximate=False))


class LinenModelDtype(nn.Module):
    """Linen MLP with a model-level `dtype` field handed down to every layer (how libraries do it)."""

    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.norm = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype)
        self.fc1 = nn.Dense(2 * D, dtype=self.dtype)
        self.fc2 = nn.Dense(D, dtype=self.dtype)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(self.norm(x)), approximate=False))


class TorchMLP(torch.nn.Module):
    """norm -> fc1 -> GELU -> fc2, the reference of the dtype pairs and the hint pairs."""

    def __init__(self, hidden: int = 2 * D):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, D)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm(x))))


class NNXMLP(nnx.Module):
    """The NNX port of TorchMLP: eps and the hidden width as asked, exact GELU, and a compute
    dtype of its own (`compute_dtype`, an attribute the cast does not know) when given one."""

    def __init__(self, hidden: int = 2 * D, eps: float = 1e-5, compute_dtype=None):
        rngs = nnx.Rngs(0)
        self.norm = nnx.LayerNorm(D, epsilon=eps, rngs=rngs)
        self.fc1 = nnx.Linear(D, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, D, rngs=rngs)
        self.compute_dtype = compute_dtype

    def __call__(self, x):
        hidden = self.fc1(self.norm(x))
        if self.compute_dtype is not None:
            hidden = hidden.astype(self.compute_dtype)
        return self.fc2(jax.nn.gelu(hidden, approximate=False))


class TorchUpcast(TorchMLP):
    """TorchMLP whose fc1 output is rounded through float32 in the code, whatever the model's dtype."""

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm(x)).float().to(x.dtype)))


def linen(module: nn.Module, x=None):
    """A Linen (module, variables) pair, initialised on x (default: activations)."""
    x = activations() if x is None else x
    return module, module.init(jax.random.key(0), x)


# --- names that differ ---


class TorchNamed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, 2 * D)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(2 * D, D)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm(x))))


class FlaxRenamed(nnx.Module):
    """TorchNamed ported with other names: ln, dense1, dense2 (defined out of call order)."""

    def __init__(self):
        rngs = nnx.Rngs(0)
        self.dense2 = nnx.Linear(2 * D, D, rngs=rngs)
        self.dense1 = nnx.Linear(D, 2 * D, rngs=rngs)
        self.ln = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)

    def __call__(self, x):
        return self.dense2(jax.nn.gelu(self.dense1(self.ln(x)), approximate=False))


class TorchStack(torch.nn.Module):
    """Two TorchNamed blocks in a ModuleList: paths blocks.0.norm, ..."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchNamed(), TorchNamed()])

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class LinenNamedBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm(epsilon=1e-5, name="norm")(x)
        return nn.Dense(D, name="fc2")(jax.nn.gelu(nn.Dense(2 * D, name="fc1")(x), approximate=False))


class LinenStack(nn.Module):
    """TorchStack in Linen: blocks_0, blocks_1, as Linen names a list of submodules."""

    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = x + LinenNamedBlock(name=f"blocks_{i}")(x)
        return x


class FlaxOneLayer(nnx.Module):
    """Nothing like TorchNamed: one wide layer, no name or structure in common."""

    def __init__(self):
        self.mix = nnx.Linear(D, 7, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.mix(x)


# --- for the hints: a norm before two square layers ---


class TorchSquare(TorchMLP):
    def __init__(self):
        super().__init__(hidden=D)


# --- a converter, as a user writes one (Linear weight -> kernel transposed, LayerNorm weight -> scale) ---


def convert(source: torch.nn.Module, target: nnx.Module, forget_transpose: str = "", scale: dict | None = None) -> nnx.Module:
    """Copy source's weights into target, module by module with the same paths. Planted bugs:
    forget_transpose names a Linear whose kernel is copied without the transpose; scale {path:
    factor} multiplies that layer's weight."""
    for path, module in source.named_modules():
        if not isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
            continue
        layer = target
        for part in path.split("."):
            layer = getattr(layer, part)
        factor = (scale or {}).get(path, 1.0)
        if isinstance(module, torch.nn.Linear):  # weight (out, in) -> kernel (in, out)
            weight = module.weight.detach().numpy() * factor
            layer.kernel[...] = jnp.asarray(weight if path == forget_transpose else weight.T)
            layer.bias[...] = jnp.asarray(module.bias.detach().numpy())
        else:
            layer.scale[...] = jnp.asarray(module.weight.detach().numpy())
            layer.bias[...] = jnp.asarray(module.bias.detach().numpy())
    return target


# --- factories for the command ---


def torch_structured():
    torch.manual_seed(0)
    return TorchStructured(), keyword_inputs()


def flax_structured():
    return FlaxStructured(), keyword_inputs()


def torch_named():
    torch.manual_seed(0)
    return TorchNamed(), activations()


def flax_renamed():
    return FlaxRenamed(), activations()


def torch_mlp():
    torch.manual_seed(0)
    return TorchMLP().eval(), activations()


def flax_narrow():
    """The port built at the wrong width: D=16 where the reference has 24."""
    return flax_block.Block(d_model=16, rngs=nnx.Rngs(0))


def torch_positions_model():
    """The position-embedding pair without inputs: ids come from the command line."""
    return TorchPositions()


def flax_positions_model():
    return FlaxPositions()


def torch_block_model():
    """The example block alone, inputs from the command line."""
    return torch_block.block()[0]


def flax_block_model():
    return flax_block.block()[0]


def raising():
    raise RuntimeError("the checkpoint file is missing")


def returns_none():
    return None


def no_parameters():
    return torch.nn.Identity(), activations()


def interrupted():
    raise KeyboardInterrupt


class TorchNaN(TorchMLP):
    def forward(self, x):
        return torch.log(super().forward(x))  # the log of the negative outputs: NaN


def torch_nan():
    torch.manual_seed(0)
    return TorchNaN(), activations()


class FlaxNaN(NNXMLP):
    def __call__(self, x):
        return jnp.log(super().__call__(x))


def flax_nan():
    return FlaxNaN(), activations()


# --- layers as libraries write them ---


class Conv1D(torch.nn.Module):
    """A linear layer that stores its weight (in, out), as a popular library's GPT-2 does."""

    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_in, n_out) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class LlamaRMSNorm(torch.nn.Module):
    """A library's RMSNorm: its epsilon is called variance_epsilon."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class TorchLM(torch.nn.Module):
    """ids (B, T) -> logits (B, T, V): embedding, RMSNorm, Conv1D layers (one square), a head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(V, D)
        self.norm = LlamaRMSNorm(D)
        self.c_fc = Conv1D(2 * D, D)
        self.c_proj = Conv1D(D, 2 * D)
        self.c_mix = Conv1D(D, D)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, ids):
        x = self.norm(self.wte(ids))
        return self.head(self.c_mix(self.c_proj(torch.tanh(self.c_fc(x)))))


class FlaxLM(nnx.Module):
    """TorchLM in NNX: Dense layers where torch has Conv1D; tied=False plants untied embeddings."""

    def __init__(self, tied: bool = True, eps: float = 1e-6):
        rngs = nnx.Rngs(0)
        self.wte = nnx.Embed(V, D, rngs=rngs)
        self.norm = nnx.RMSNorm(D, epsilon=eps, rngs=rngs)
        self.c_fc = nnx.Linear(D, 2 * D, rngs=rngs)
        self.c_proj = nnx.Linear(2 * D, D, rngs=rngs)
        self.c_mix = nnx.Linear(D, D, rngs=rngs)
        self.head = None if tied else nnx.Linear(D, V, use_bias=False, rngs=rngs)

    def __call__(self, ids):
        x = self.c_mix(self.c_proj(jnp.tanh(self.c_fc(self.norm(self.wte(ids))))))
        return self.wte.attend(x) if self.head is None else self.head(x)


class TorchConvNet(torch.nn.Module):
    """(B, 3, H, W) -> (B, 4): conv 3x3 with explicit padding, BatchNorm in eval, mean over space."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        with torch.no_grad():  # statistics of a trained model, not the fresh ones
            self.bn.running_mean.copy_(torch.randn(4))
            self.bn.running_var.copy_(torch.rand(4) + 0.5)
        self.eval()

    def forward(self, x):
        return self.bn(self.conv(x)).mean((2, 3))


class FlaxConvNet(nnx.Module):
    """TorchConvNet in NNX: NHWC, 'SAME' padding, BatchNorm with the running averages."""

    def __init__(self):
        rngs = nnx.Rngs(0)
        self.conv = nnx.Conv(3, 4, (3, 3), padding="SAME", rngs=rngs)
        self.bn = nnx.BatchNorm(4, use_running_average=True, momentum=0.9, epsilon=1e-5, rngs=rngs)

    def __call__(self, x):
        return self.bn(self.conv(x)).mean((1, 2))
