"""The zoo's configurations, shared by both frameworks' models: frozen dataclasses checked on
creation. The tiny defaults use odd, distinct sizes, so that a swapped axis cannot pass;
`gpt2_small()` is GPT-2 small's shape (124M parameters) and `llama_3_2_1b()` Llama-3.2-1B's (1.24B),
built by the same code, for benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


def _positive(config) -> None:
    for name, value in vars(config).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be positive; got {value!r}")


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention."""

    vocab_size: int = 37
    d_model: int = 24
    n_heads: int = 4
    n_kv_heads: int = 2  # each kv head serves n_heads // n_kv_heads = 2 query heads: the head order matters
    d_ff: int = 40
    n_layers: int = 2
    rms_norm_eps: float = 1e-5  # Llama 2's; torch's RMSNorm default is the dtype's machine epsilon, Flax's 1e-6
    rope_base: float = 10000.0

    def __post_init__(self):
        _positive(self)
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"need n_kv_heads | n_heads | d_model; got {self.n_kv_heads}, {self.n_heads}, {self.d_model}")
        if self.d_head % 2:
            raise ValueError(f"rotary embeddings rotate pairs of channels: d_head must be even; got {self.d_head}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class _Heads:
    """What a configuration of multi-head attention checks and derives: d_model splits into n_heads."""

    d_model: int
    n_heads: int

    def _check_heads(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {self.d_model}, {self.n_heads}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class GPT2Config(_Heads):
    """A GPT-2-style model: learned positions, pre-LayerNorm blocks, tanh GELU, tied embeddings."""

    vocab_size: int = 41
    n_positions: int = 11
    d_model: int = 20
    n_heads: int = 4  # d_head 5: 1/d and 1/sqrt(d) differ
    n_layers: int = 2
    layer_norm_epsilon: float = 1e-5  # torch's LayerNorm default; Flax's is 1e-6

    def __post_init__(self):
        _positive(self)
        self._check_heads()


def llama_3_2_1b() -> LlamaConfig:
    """Llama-3.2-1B's shape: 1.24B parameters (the tied output layer counted once)."""
    return LlamaConfig(vocab_size=128256, d_model=2048, n_heads=32, n_kv_heads=8, d_ff=8192, n_layers=16, rope_base=500000.0)


def gpt2_small() -> GPT2Config:
    """GPT-2 small's shape: 124M parameters (the tied output layer counted once)."""
    return GPT2Config(vocab_size=50257, n_positions=1024, d_model=768, n_heads=12, n_layers=12)


@dataclass(frozen=True)
class ViTConfig:
    """A small convolutional ViT: a conv stem with BatchNorm and a stride-2 downsampling conv, a
    patch embedding, transformer blocks, mean pooling and a classification head."""

    in_channels: int = 3
    height: int = 18  # even: the stem's stride-2 conv pads like torch's padding=1 only by explicit pads
    width: int = 30  # not the height: a kernel or image transposed in space cannot pass
    stem_channels: int = 7
    patch: int = 3
    d_model: int = 20
    n_heads: int = 4
    d_mlp: int = 44
    n_layers: int = 2
    n_classes: int = 11
    layer_norm_eps: float = 1e-6  # timm's ViT sets 1e-6 (Flax's default); torch's own default is 1e-5
    batch_norm_eps: float = 1e-5  # the default of both frameworks

    def __post_init__(self):
        _positive(self)
        if self.stem_height % self.patch or self.stem_width % self.patch:
            raise ValueError(
                f"the stem's output ({self.stem_height}, {self.stem_width}) of an image ({self.height}, {self.width}) "
                f"must divide into patches of {self.patch}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {self.d_model}, {self.n_heads}")

    @property
    def stem_height(self) -> int:
        """The stem's output height: its stride-2 conv (3x3, padding 1) gives ceil(height / 2)."""
        return (self.height + 1) // 2

    @property
    def stem_width(self) -> int:
        return (self.width + 1) // 2

    @property
    def n_patches(self) -> int:
        return (self.stem_height // self.patch) * (self.stem_width // self.patch)


@dataclass(frozen=True)
class Seq2SeqConfig(_Heads):
    """A BART-style encoder-decoder: one token embedding shared by both stacks and scaled by
    sqrt(d_model), pre-LayerNorm layers, a final LayerNorm on each stack."""

    vocab_size: int = 29
    d_model: int = 18
    n_heads: int = 3  # d_head 6
    d_ff: int = 26
    n_layers: int = 1  # in each stack
    layer_norm_eps: float = 1e-5  # torch's LayerNorm default; Flax's is 1e-6

    def __post_init__(self):
        _positive(self)
        self._check_heads()


@dataclass(frozen=True)
class ConvNetConfig:
    """A small conv encoder whose feature maps have as many channels as rows and columns (so that
    NCHW and NHWC have one shape): a conv, a weight-normed conv, the map read as tokens with a
    sinusoidal position table, a LayerNorm, mean pooling and a head."""

    channels: int = 8  # the images' channels and every feature map's
    size: int = 8  # height = width = channels: only what each module is tells the layouts apart
    n_classes: int = 5
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        _positive(self)
        if self.channels % 2:
            raise ValueError(f"a sinusoidal table pairs sines with cosines: channels must be even; got {self.channels}")

    @property
    def n_positions(self) -> int:
        return self.size * self.size
