"""Bad weight dicts and bad weight files, for the tests of every reader of weights: the contract
(tests/contract/test_weights.py), the backends' converters (tests/implementations/) and the
commands that --load a file (tests/tools/)."""

import json
import re

import numpy as np
import safetensors.numpy

from shared import weights
from shared.config import ModelConfig
from shared.weights import init_weights
from tests.backends import SMALL

D, V, L = SMALL.d_model, SMALL.vocab_size, SMALL.max_len  # 24, 11, 7
DESCRIBED = "ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7, bias=True)"


def exactly(message):
    """A pytest.raises match for this exact message and nothing else (so every reader agrees)."""
    return "^" + re.escape(message) + "$"


def changed(name=None, value=None, drop=None, dtype=None):
    """SMALL's weights (seed 0, float32) with one key dropped, one replaced or every dtype changed."""
    arrays = init_weights(SMALL, 0)
    if drop is not None:
        del arrays[drop]
    if name is not None:
        arrays[name] = value
    if dtype is not None:
        arrays = {key: array.astype(dtype) for key, array in arrays.items()}
    return arrays


def transposed(name):
    return np.ascontiguousarray(init_weights(SMALL, 0)[name].T)


# name: (weights given for SMALL, the exception, a pattern of its whole message); every reader of a
# weight dict or a weights file refuses each the same way, before it builds or reads anything more
BAD_ARRAYS = {
    "missing key": (
        changed(drop="lm_head.bias"),
        ValueError,
        rf"^weights are missing key\(s\) 'lm_head.bias' \(11,\) required by {re.escape(DESCRIBED)}$",
    ),
    "extra key": (
        changed("attn.causal_mask", np.ones((L, L), np.float32)),
        ValueError,
        r"^weights have unexpected key\(s\) \['attn.causal_mask'\]; .* expects exactly \['tok_emb.weight', ",
    ),
    "wrong shape": (
        changed("lm_head.weight", np.zeros((V, D - 1), np.float32)),
        ValueError,
        exactly("weights['lm_head.weight'] has shape (11, 23), expected (11, 24)"),
    ),
    "another config's weights": (
        init_weights(ModelConfig(vocab_size=V + 1, d_model=D, n_heads=SMALL.n_heads, max_len=L), 0),
        ValueError,
        exactly("weights['tok_emb.weight'] has shape (12, 24), expected (11, 24)"),
    ),
    "transposed qkv kernel": (
        changed("attn.qkv_proj.weight", transposed("attn.qkv_proj.weight")),
        ValueError,
        exactly("weights['attn.qkv_proj.weight'] has shape (24, 72), expected (72, 24) (looks transposed: exchange weights are PyTorch (out, in))"),
    ),
    "transposed lm_head kernel": (
        changed("lm_head.weight", transposed("lm_head.weight")),
        ValueError,
        exactly("weights['lm_head.weight'] has shape (24, 11), expected (11, 24) (looks transposed: exchange weights are PyTorch (out, in))"),
    ),
    "float16": (changed(dtype=np.float16), ValueError, exactly("weights['tok_emb.weight'] has dtype float16, expected one of float32, float64")),
    "int64": (changed(dtype=np.int64), ValueError, exactly("weights['tok_emb.weight'] has dtype int64, expected one of float32, float64")),
    "mixed dtypes": (
        changed("lm_head.bias", np.zeros(V, np.float64)),
        ValueError,
        r"^weights mix dtypes \{'float32': \[.*\], 'float64': \['lm_head.bias'\]\}; expected one dtype for every array$",
    ),
    "not an array": (changed("lm_head.bias", [0.0] * V), TypeError, exactly("weights['lm_head.bias'] must be a NumPy array, got list")),
}
IN_A_FILE = [case for case in BAD_ARRAYS if case != "not an array"]  # what a safetensors file can hold


def write_exchange(path, arrays, config=None):
    """A file in the exchange format that bypasses weights.save's own validation (config: SMALL's by default)."""
    config = SMALL.to_dict() if config is None else config
    metadata = {"format": weights.FORMAT, "format_version": weights.FORMAT_VERSION, "config": json.dumps(config)}
    safetensors.numpy.save_file(arrays, str(path), metadata)
    return path


def good_bytes(tmp_path):
    """The bytes of a valid weights file of SMALL."""
    path = tmp_path / "good.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    return path.read_bytes()


class Payload:
    """Unpickling this creates `marker`: proof that nothing was unpickled if it stays absent."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))
