"""A child process for test_scale.py's memory test: the zoo's Llama pair at LAYERS layers of a
width where the weights dwarf everything else (1024 wide, FFN 4096: 63 MB of float32 a layer a
side), built, then checked in float32 with the port holding the converter's weights; prints how
far the check's peak rose above the resident memory before it (bytes: bench_common.peak_extra_bytes,
once the models are built, a tiny check has warmed up and glibc has handed its free heap back).

    python -m tests.tools.port_check.check_memory LAYERS [grads]
"""

import gc
import sys

import numpy as np
from flax import nnx

from examples.zoo import llama_convert, llama_flax, llama_torch
from examples.zoo.configs import LlamaConfig
from examples.zoo.convert import abstract, load_nnx
from examples.zoo.torch_weights import numpy_state
from mhsa.port_check import check_port
from shared.malloc import _glibc
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks' own peak measurement, not a second one
import bench_common  # noqa: E402


def main(layers: int, grads: bool) -> None:
    config = LlamaConfig(vocab_size=512, d_model=1024, n_heads=8, n_kv_heads=4, d_ff=4096, n_layers=layers)
    reference = llama_torch.build(config)
    arrays = llama_convert.to_flax(numpy_state(reference), config)
    port = load_nnx(abstract(lambda: llama_flax.Llama(config, dtype="float32", rngs=nnx.Rngs(0))), arrays)
    del arrays
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, 8))
    check_port(llama_torch.build(), llama_convert.ported()[0], llama_torch.example_inputs(), probes=False)  # imports and first compiles
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)

    def checked():
        report = check_port(reference, port, (ids,), probes=False, grads=grads)
        assert report.passed, report.rows

    print(bench_common.peak_extra_bytes(checked))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:] == ["grads"])
