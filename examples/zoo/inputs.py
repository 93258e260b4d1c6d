"""The example batches of the zoo, in NumPy: the same numbers for both frameworks, each in its own
layout where the layouts differ (images: torch NCHW, Flax NHWC)."""

from __future__ import annotations

import numpy as np

from examples.zoo.configs import ConvNetConfig, GPT2Config, LlamaConfig, Seq2SeqConfig, ViTConfig

B, T = 3, 7  # batch and sequence length of the language models: odd, distinct from every width
IMAGES = 5  # images in the vision batch
SOURCE, TARGET = 7, 5  # the encoder-decoder's source and target lengths


def token_ids(vocab_size: int, seed: int = 0, shape: tuple[int, int] = (B, T)) -> np.ndarray:
    """(B, T) int64 token ids in [0, vocab_size)."""
    return np.random.default_rng(seed).integers(0, vocab_size, shape, dtype=np.int64)


def padding_mask() -> np.ndarray:
    """(B, T) int64, 1 = a real token, 0 = padding (the convention of the popular library): rows of
    7, 5 and 2 real tokens, padded on the right, so that every query keeps at least one key."""
    lengths = np.array([T, T - 2, 2])
    return (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)


def llama(config: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids (B, T), attention_mask (B, T)), positionally."""
    return token_ids(config.vocab_size), padding_mask()


def llama_keywords(config: LlamaConfig) -> dict[str, np.ndarray]:
    """The same batch as keyword arguments."""
    input_ids, attention_mask = llama(config)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def gpt2(config: GPT2Config, shape: tuple[int, int] = (B, T)) -> tuple[np.ndarray]:
    """(input_ids (B, T),)."""
    return (token_ids(config.vocab_size, seed=1, shape=shape),)


def images_nchw(config: ViTConfig, seed: int = 2) -> np.ndarray:
    """(IMAGES, C, H, W) float32: torch's layout."""
    return np.random.default_rng(seed).standard_normal((IMAGES, config.in_channels, config.height, config.width)).astype(np.float32)


def images_nhwc(config: ViTConfig, seed: int = 2) -> np.ndarray:
    """(IMAGES, H, W, C) float32: the same images in Flax's layout."""
    return np.ascontiguousarray(images_nchw(config, seed).transpose(0, 2, 3, 1))


def seq2seq(config: Seq2SeqConfig) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids (B, SOURCE), decoder_input_ids (B, TARGET)), int64."""
    return token_ids(config.vocab_size, seed=3, shape=(B, SOURCE)), token_ids(config.vocab_size, seed=4, shape=(B, TARGET))


def square_images_nchw(config: ConvNetConfig, seed: int = 5) -> np.ndarray:
    """(IMAGES, C, S, S) float32 with C = S: torch's layout, of the same shape as Flax's."""
    return np.random.default_rng(seed).standard_normal((IMAGES, config.channels, config.size, config.size)).astype(np.float32)


def square_images_nhwc(config: ConvNetConfig, seed: int = 5) -> np.ndarray:
    """The same images in Flax's layout, (IMAGES, S, S, C)."""
    return np.ascontiguousarray(square_images_nchw(config, seed).transpose(0, 2, 3, 1))
