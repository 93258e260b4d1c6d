"""Small torch models and their Flax ports written the way popular libraries write theirs, each
pair faithful unless a planted bug is asked for: a final LayerNorm at its init, Flax's one-pass
LayerNorm variance, an encoder-decoder sharing one embedding with a converter's leftovers, a conv
net with C = H = W, a frozen sinusoidal table, an embedding scaled inside torch's module and after
Flax's, one output read by two modules of which one is blind to a bug in it, a zero-initialized
projection, a weight-normed conv and a norm whose weight is called `scale`, attention weights one
side returns as None. Odd, distinct sizes: B=3, T=5, D=24, V=11."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import linen as nn
from flax import nnx
from torch.nn.utils import parametrizations

B, T, D, V = 3, 5, 24, 11


def token_ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (B, T))


def activations(seed: int = 0, offset: float = 0.0) -> np.ndarray:
    return (offset + np.random.default_rng(seed).standard_normal((B, T, D))).astype(np.float32)


# --- a model that ends in a LayerNorm at its init (weight 1, bias 0), with a key projection's bias ---


class TorchEncoder(torch.nn.Module):
    """ids (B, T) -> (B, T, D): embedding, one attention head with biased q, k, v, a final LayerNorm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, D)
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))
        self.norm = torch.nn.LayerNorm(D)

    def forward(self, ids):
        x = self.embed(ids)
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(D), dim=-1)  # (B, T, T)
        return self.norm(x + weights @ self.v(x))


class FlaxEncoder(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.q, self.k, self.v = (nnx.Linear(D, D, rngs=rngs) for _ in range(3))
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)

    def __call__(self, ids):
        x = self.embed(ids)
        weights = jax.nn.softmax(self.q(x) @ self.k(x).swapaxes(-2, -1) / math.sqrt(D), axis=-1)  # (B, T, T)
        return self.norm(x + weights @ self.v(x))


# --- Flax's LayerNorm computes the variance in one pass, E[x^2] - E[x]^2: it rounds more ---


class TorchNormed(torch.nn.Module):
    """(B, T, D) -> (B, T, D): Linear, LayerNorm, Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.norm, self.down = torch.nn.Linear(D, D), torch.nn.LayerNorm(D), torch.nn.Linear(D, D)
        with torch.no_grad():
            self.up.bias += 2.0  # features away from 0: the one-pass variance cancels, its rounding about 12x torch's

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


class FlaxNormed(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.up, self.norm, self.down = nnx.Linear(D, D, rngs=rngs), nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return self.down(self.norm(self.up(x)))


# --- an encoder-decoder sharing one embedding (Linen, as libraries write it), converted with leftovers ---


class TorchSeq2Seq(torch.nn.Module):
    """(ids, decoder ids) -> logits (B, T, V): one embedding shared by the encoder, the decoder and
    the tied head; its state_dict lists it four times, as libraries' encoder-decoders do."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.shared = torch.nn.Embedding(V, D)
        self.encoder = torch.nn.Module()
        self.encoder.embed_tokens = self.shared
        self.encoder.fc = torch.nn.Linear(D, D)
        self.decoder = torch.nn.Module()
        self.decoder.embed_tokens = self.shared
        self.decoder.fc = torch.nn.Linear(D, D)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.shared.weight

    def forward(self, ids, decoder_ids):
        memory = torch.tanh(self.encoder.fc(self.encoder.embed_tokens(ids)))
        hidden = torch.tanh(self.decoder.fc(self.decoder.embed_tokens(decoder_ids)) + memory.mean(1, keepdim=True))
        return self.lm_head(hidden)


class LinenEncoder(nn.Module):
    embed_tokens: nn.Module

    @nn.compact
    def __call__(self, ids):
        return jnp.tanh(nn.Dense(D, name="fc")(self.embed_tokens(ids)))


class LinenDecoder(nn.Module):
    embed_tokens: nn.Module

    @nn.compact
    def __call__(self, ids, memory):
        return jnp.tanh(nn.Dense(D, name="fc")(self.embed_tokens(ids)) + memory.mean(1, keepdims=True))


class LinenSeq2Seq(nn.Module):
    def setup(self):
        self.shared = nn.Embed(V, D)
        self.encoder = LinenEncoder(self.shared)
        self.decoder = LinenDecoder(self.shared)

    def __call__(self, ids, decoder_ids):
        return self.shared.attend(self.decoder(decoder_ids, self.encoder(ids)))


def seq2seq_inputs():
    return token_ids(0), token_ids(1)


def converted_seq2seq(reference: TorchSeq2Seq, untie: bool = False):
    """The Linen pair with the reference's weights, converted as a library's converter does: every
    state_dict entry becomes a variable, so `encoder/embed_tokens` and `decoder/embed_tokens` sit
    beside `shared`, which is the one the module reads. untie: a port whose decoder has an embedding
    of its own (a copy: the same logits, other gradients)."""
    state = {name: value.detach().numpy() for name, value in reference.state_dict().items()}
    params = {
        "shared": {"embedding": state["shared.weight"]},
        "encoder": {"embed_tokens": {"embedding": state["encoder.embed_tokens.weight"]}, "fc": _dense(state, "encoder.fc")},
        "decoder": {"embed_tokens": {"embedding": state["decoder.embed_tokens.weight"]}, "fc": _dense(state, "decoder.fc")},
    }
    module = LinenSeq2Seq()
    if untie:
        module = UntiedSeq2Seq()
    return module, {"params": jax.tree.map(jnp.asarray, params)}


class UntiedDecoder(nn.Module):
    @nn.compact
    def __call__(self, ids, memory):
        return jnp.tanh(nn.Dense(D, name="fc")(nn.Embed(V, D, name="embed_tokens")(ids)) + memory.mean(1, keepdims=True))


class UntiedSeq2Seq(nn.Module):
    def setup(self):
        self.shared = nn.Embed(V, D)
        self.encoder = LinenEncoder(self.shared)
        self.decoder = UntiedDecoder()

    def __call__(self, ids, decoder_ids):
        return self.shared.attend(self.decoder(decoder_ids, self.encoder(ids)))


def _dense(state, prefix):
    return {"kernel": state[f"{prefix}.weight"].T, "bias": state[f"{prefix}.bias"]}


# --- a conv net with C = H = W: 8 channels on 8 x 8 images ---

C = 8


class TorchConvNet(torch.nn.Module):
    """(B, C, C, C) NCHW -> (B, 5): two conv blocks keeping C channels at C x C, a pooled head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.bn1 = torch.nn.Conv2d(C, C, 3, padding=1), torch.nn.BatchNorm2d(C)
        self.conv2 = torch.nn.Conv2d(C, C, 3, padding=1)
        self.head = torch.nn.Linear(C, 5)
        with torch.no_grad():
            self.bn1.running_mean.normal_()
            self.bn1.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x)) + x
        return self.head(x.mean((2, 3)))


class FlaxConvNet(nnx.Module):
    """The same in NHWC; bug="transposed": the second conv reads the map with H and W swapped (at
    H = W the shapes cannot tell)."""

    def __init__(self, bug: str = ""):
        rngs = nnx.Rngs(0)
        self.conv1, self.bn1 = nnx.Conv(C, C, (3, 3), padding=1, rngs=rngs), nnx.BatchNorm(C, use_running_average=True, momentum=0.9, rngs=rngs)
        self.conv2 = nnx.Conv(C, C, (3, 3), padding=1, rngs=rngs)
        self.head = nnx.Linear(C, 5, rngs=rngs)
        self.bug = bug

    def __call__(self, x):
        x = jax.nn.relu(self.bn1(self.conv1(x)))
        read = x.transpose(0, 2, 1, 3) if self.bug == "transposed" else x
        x = jax.nn.relu(self.conv2(read)) + x
        return self.head(x.mean((1, 2)))


def images(seed: int = 0) -> np.ndarray:
    """(B, C, C, C) NCHW: channels, height and width all equal."""
    return np.random.default_rng(seed).standard_normal((B, C, C, C)).astype(np.float32)


# --- a frozen sinusoidal table: the same in a fresh port, so no evidence of a conversion ---


def sinusoids(length: int, channels: int) -> np.ndarray:
    """(length, channels): sin of each position at channels // 2 frequencies, then cos, as Whisper's."""
    scales = np.exp(-np.log(10000.0) / (channels // 2 - 1) * np.arange(channels // 2))
    angles = np.arange(length)[:, None] * scales[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


class TorchTabled(torch.nn.Module):
    """(B, T, D) -> (B, T, D): positions from a frozen sinusoidal table, then a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed_positions = torch.nn.Embedding(16, D)
        with torch.no_grad():
            self.embed_positions.weight.copy_(torch.from_numpy(sinusoids(16, D)))
        self.embed_positions.requires_grad_(False)
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x):
        return self.fc(x + self.embed_positions.weight[: x.shape[1]])


class FlaxTabled(nnx.Module):
    """A fresh port: the table initialised to the same sinusoids, the Linear random."""

    def __init__(self):
        self.embed_positions = nnx.Embed(16, D, embedding_init=lambda *_: jnp.asarray(sinusoids(16, D)), rngs=nnx.Rngs(0))
        self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(1))

    def __call__(self, x):
        return self.fc(x + self.embed_positions.embedding[: x.shape[1]])


# --- an embedding scaled by sqrt(D) inside torch's module, after Flax's nn.Embed ---


class ScaledEmbedding(torch.nn.Embedding):
    """A library's scaled word embedding: the lookup times sqrt(D), in the module."""

    def forward(self, ids):
        return super().forward(ids) * math.sqrt(D)


class TorchMixer(torch.nn.Module):
    """(B, T, D) -> ((B, T, D), None): a Linear returning an attention's tuple, its weights not asked for."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x):
        return self.proj(x), None


class TorchScaled(torch.nn.Module):
    """ids (B, T) -> (B, T, D): a scaled embedding, LayerNorm, a mixer returning (output, None), two Linears."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = ScaledEmbedding(V, D)
        self.norm = torch.nn.LayerNorm(D)
        self.mixer = TorchMixer()
        self.fc1, self.fc2 = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)

    def forward(self, ids):
        hidden, _ = self.mixer(self.norm(self.embed_tokens(ids)))
        return self.fc2(torch.tanh(self.fc1(hidden)))


class FlaxScaled(nnx.Module):
    """The same with nnx.Embed and the scale after it; bug="fc2_bias": fc2 adds its bias twice."""

    def __init__(self, bug: str = ""):
        rngs = nnx.Rngs(0)
        self.embed_tokens = nnx.Embed(V, D, rngs=rngs)
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)
        self.mixer = FlaxMixer(rngs)
        self.fc1, self.fc2 = nnx.Linear(D, 2 * D, rngs=rngs), nnx.Linear(2 * D, D, rngs=rngs)
        self.bug = bug

    def __call__(self, ids):
        hidden, _ = self.mixer(self.norm(self.embed_tokens(ids) * math.sqrt(D)))
        hidden = jnp.tanh(self.fc1(hidden))
        return self.fc2(hidden) + (self.fc2.bias[...] if self.bug == "fc2_bias" else 0.0)


class FlaxMixer(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return self.proj(x), None


# --- one output read by two modules, one of which cannot see a difference in it ---


class TorchTwoReaders(torch.nn.Module):
    """(B, T, D) -> (B, T, D): `time`'s output read by a LayerNorm (blind to a shift of all its
    features by one number) and by a Linear, as a diffusion model's time embedding is read by the
    norm of one block and the projection of another."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.time = torch.nn.Linear(D, D)
        self.norm = torch.nn.LayerNorm(D)
        self.proj, self.out = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

    def forward(self, x):
        t = self.time(x)
        return self.out(self.norm(t) + self.proj(t))


class FlaxTwoReaders(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.time = nnx.Linear(D, D, rngs=rngs)
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)
        self.proj, self.out = nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        t = self.time(x)
        return self.out(self.norm(t) + self.proj(t))


# --- a zero-initialized projection (a ControlNet's zero conv): its output is 0 whatever it reads ---


class TorchZeroOut(torch.nn.Module):
    """(B, T, D) -> (B, T, D): a Linear, then a Linear whose weight and bias are 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(D, D)
        self.zero = torch.nn.Linear(D, D)
        torch.nn.init.zeros_(self.zero.weight), torch.nn.init.zeros_(self.zero.bias)

    def forward(self, x):
        return self.zero(torch.tanh(self.inner(x)))


class FlaxZeroOut(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.inner, self.zero = nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return self.zero(jnp.tanh(self.inner(x)))


def converted_linears(reference: torch.nn.Module, port: nnx.Module, bug: str = "") -> nnx.Module:
    """`port` with each of its nnx.Linear holding the reference's Linear of the same name; bug:
    "shifted:<name>" adds 0.5 to that Linear's bias, "transposed:<name>" loads its weight
    untransposed (square)."""
    kind, _, buggy = bug.partition(":")
    for name, layer in reference.named_children():
        if isinstance(layer, torch.nn.Linear):
            weight, bias = layer.weight.detach().numpy(), layer.bias.detach().numpy()
            getattr(port, name).kernel[...] = jnp.asarray(weight if kind == "transposed" and name == buggy else weight.T)
            getattr(port, name).bias[...] = jnp.asarray(bias + (0.5 if kind == "shifted" and name == buggy else 0.0))
    return port


# --- a weight-normed conv (torch's parametrization; the port's weight_g and weight_v) and a norm's `scale` ---


class TorchWeightNormed(torch.nn.Module):
    """(B, D, T) -> (B, D, T): a weight-normed Conv1d over time (norm over all but the kernel axis,
    as a speech model's positional conv), then an RMS norm written by hand."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = parametrizations.weight_norm(torch.nn.Conv1d(D, D, 3, padding=1), name="weight", dim=2)
        self.norm = HandRMSNorm()

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.conv(x)).transpose(1, 2))


class HandRMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, D))
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class FlaxWeightNormConv(nnx.Module):
    """A conv from weight_v (out, in, kernel) and weight_g (1, 1, kernel), as a library's Flax port."""

    def __init__(self, rngs):
        self.weight_v = nnx.Param(jax.random.normal(rngs.params(), (D, D, 3)))
        self.weight_g = nnx.Param(jnp.linalg.norm(self.weight_v[...], axis=(0, 1))[None, None, :])
        self.bias = nnx.Param(jnp.zeros(D))

    def __call__(self, x):  # (B, T, D) -> (B, T, D)
        kernel = self.weight_v[...] / jnp.linalg.norm(self.weight_v[...], axis=(0, 1))[None, None, :] * self.weight_g[...]
        y = jax.lax.conv_general_dilated(x, kernel.transpose(2, 1, 0), (1,), ((1, 1),), dimension_numbers=("NWC", "WIO", "NWC"))
        return y + self.bias[...]


class FlaxRMSNorm(nnx.Module):
    def __init__(self):
        self.scale = nnx.Param(jnp.ones(D))
        self.eps = 1e-6

    def __call__(self, x):
        return x * jax.lax.rsqrt((x**2).mean(-1, keepdims=True) + self.eps) * self.scale[...]


class FlaxWeightNormed(nnx.Module):
    def __init__(self):
        self.conv = FlaxWeightNormConv(nnx.Rngs(0))
        self.norm = FlaxRMSNorm()

    def __call__(self, x):  # x (B, D, T), as torch's: the port moves the channels last itself
        return self.norm(jax.nn.gelu(self.conv(x.transpose(0, 2, 1)), approximate=False))


def sequences(seed: int = 0) -> np.ndarray:
    """(B, D, T) channels-first sequences."""
    return np.random.default_rng(seed).standard_normal((B, D, T)).astype(np.float32)


# --- attention weights one side returns as None ---


class TorchWithWeights(torch.nn.Module):
    """(B, T, D) -> (hidden, None): the attention weights are returned only when asked for."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x):
        return self.fc(x), None


class FlaxWithWeights(nnx.Module):
    """Returns the weights whether asked or not."""

    def __init__(self):
        self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(0))

    def __call__(self, x):
        hidden = self.fc(x)
        return hidden, jax.nn.softmax(hidden @ hidden.swapaxes(-2, -1), axis=-1)


# --- Gemma's head-shaped Einsum kernels, the input between the head axes, against q, k, v, o Linears ---

N, K, DH = 3, 1, 8  # query heads, key-value heads, d_head: N * DH == D


class TorchGroupedAttention(torch.nn.Module):
    """(B, T, D) -> (B, T, D): grouped-query attention (N query heads share K key-value heads), no
    mask, with q, k, v, o as four Linears without biases, as a Hugging Face Gemma keeps them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj, self.o_proj = torch.nn.Linear(D, N * DH, bias=False), torch.nn.Linear(N * DH, D, bias=False)
        self.k_proj, self.v_proj = (torch.nn.Linear(D, K * DH, bias=False) for _ in range(2))

    def forward(self, x):
        q = self.q_proj(x).unflatten(-1, (N, DH)).transpose(1, 2)  # (B, N, T, DH)
        k, v = (proj(x).unflatten(-1, (K, DH)).transpose(1, 2).repeat_interleave(N // K, dim=1) for proj in (self.k_proj, self.v_proj))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(DH), dim=-1)  # (B, N, T, T)
        return self.o_proj((weights @ v).transpose(1, 2).flatten(2))


class FlaxEinsumAttention(nnx.Module):
    """The same with big_vision's Gemma kernels: q (N, D, DH), k and v fused (2, K, D, DH), o (N, DH, D)."""

    def __init__(self):
        rngs = nnx.Rngs(0)
        self.q_einsum = nnx.Einsum("BTD,NDH->BTNH", (N, D, DH), rngs=rngs)
        self.kv_einsum = nnx.Einsum("BSD,CKDH->CBSKH", (2, K, D, DH), rngs=rngs)
        self.attn_vec_einsum = nnx.Einsum("BTNH,NHD->BTD", (N, DH, D), rngs=rngs)

    def __call__(self, x):
        q = self.q_einsum(x)  # (B, T, N, DH)
        k, v = (jnp.repeat(part, N // K, axis=2) for part in self.kv_einsum(x))  # (B, S, N, DH) each
        weights = jax.nn.softmax(jnp.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(DH), axis=-1)
        return self.attn_vec_einsum(jnp.einsum("BNTS,BSNH->BTNH", weights, v))


def converted_einsum(reference: TorchGroupedAttention) -> FlaxEinsumAttention:
    """big_vision's converter: each Linear's weight in the Einsum's layout."""
    state = {name: value.detach().numpy() for name, value in reference.state_dict().items()}
    port = FlaxEinsumAttention()
    port.q_einsum.kernel[...] = state["q_proj.weight"].reshape(N, DH, D).transpose(0, 2, 1)
    port.kv_einsum.kernel[...] = np.stack([state[f"{p}_proj.weight"].reshape(K, DH, D).transpose(0, 2, 1) for p in "kv"])
    port.attn_vec_einsum.kernel[...] = state["o_proj.weight"].T.reshape(N, DH, D)
    return port
