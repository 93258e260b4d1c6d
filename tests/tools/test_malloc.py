"""Every run of a model in the port check (the reference, its float64 run, the port) keeps the
memory it frees for its next allocations (shared/malloc.py): inside the block a
large block freed and asked for again takes no page faults; after it, or after an error in it, glibc's settled thresholds are back: a
48 MiB block (above the settled mmap threshold, 32 MiB) and 72 MiB freed in 24 MiB blocks (above
the settled trim threshold, 64 MiB) go back to the kernel and fault in again; a process started
with its own malloc settings is left as it is. Measured by the process's minor page faults."""

import resource

import pytest
import torch

from mhsa.port_check import check_port, format_report
from shared import malloc as freed_memory
from tests.tools.port_check.models import NNXMLP, TorchMLP, activations

MIB = 2**20
LARGE = [48 * MIB]  # above glibc's settled mmap threshold (32 MiB), below its settled trim threshold (64 MiB)
MANY = [24 * MIB] * 3  # each below the mmap threshold, together above the trim threshold

needs_glibc = pytest.mark.skipif(freed_memory._libc() is None, reason="glibc is not this process's C library, or malloc settings are the user's")


def pages(sizes: list[int]) -> int:
    return sum(sizes) // resource.getpagesize()


def faults_of(sizes: list[int]) -> int:
    """Minor page faults taken to allocate blocks of `sizes` bytes, held together, and write every
    page; all freed again."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [bytearray(size) for size in sizes]  # malloc and a write to every page (NumPy would ask for huge pages)
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def assert_kept(sizes: list[int], when: str) -> None:
    faults_of(sizes)  # the heap grows once
    kept = faults_of(sizes)
    assert kept < pages(sizes) // 10, f"{kept} page faults for {sizes} bytes freed and asked for again {when}; expected few of {pages(sizes)} pages"


def assert_handed_back(sizes: list[int], when: str) -> None:
    faults_of(sizes)
    again = faults_of(sizes)
    assert again > pages(sizes) // 2, f"{again} page faults for {sizes} bytes freed and asked for again {when}; expected most of {pages(sizes)} pages"


@needs_glibc
def test_inside_the_block_freed_memory_is_reused_and_after_it_goes_back_to_the_kernel():
    with freed_memory.kept_for_reuse():
        assert_kept(LARGE, "inside the block")
        assert_kept(MANY, "inside the block")
    assert_handed_back(LARGE, "after the block (mmap threshold settled)")
    assert_handed_back(MANY, "after the block (trim threshold settled)")


@needs_glibc
def test_an_error_in_the_block_still_settles_the_thresholds():
    with pytest.raises(RuntimeError, match="inside"):
        with freed_memory.kept_for_reuse():
            raise RuntimeError("inside")
    assert_handed_back(LARGE, "after an error in the block")
    assert_handed_back(MANY, "after an error in the block")


@needs_glibc
def test_a_block_inside_another_leaves_the_outer_one_keeping_memory():
    with freed_memory.kept_for_reuse():
        with freed_memory.kept_for_reuse():
            pass
        assert_kept(LARGE, "in the outer block after the inner one ended")


@needs_glibc
def test_a_process_started_with_its_own_malloc_settings_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576")
    with freed_memory.kept_for_reuse():
        assert_handed_back(LARGE, "under the user's malloc settings (nothing kept)")


def test_the_users_malloc_settings_are_read_from_glibc_tunables_and_malloc_variables():
    environ = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2:glibc.malloc.trim_threshold=0", "MALLOC_ARENA_MAX_": "2", "MALLOCATE": "x", "PATH": "/bin"}
    assert freed_memory.user_settings(environ) == ["glibc.malloc.trim_threshold=0", "MALLOC_ARENA_MAX_"]
    assert freed_memory.user_settings({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2", "PATH": "/bin"}) == []


@pytest.mark.parametrize("grads", [False, True], ids=["forward", "with gradients"])
def test_every_run_of_a_model_in_the_check_is_in_a_block_that_keeps_memory(grads):
    """All but the float64 twin's run with gradients (forward/derived.py says why)."""
    runs = []

    class Reference(TorchMLP):
        def forward(self, x):
            runs.append(("torch", x.dtype, freed_memory._depth))
            return super().forward(x)

    class Port(NNXMLP):
        def __call__(self, x):
            runs.append(("flax", x.dtype, freed_memory._depth))  # at trace time, inside the run
            return super().__call__(x)

    report = check_port(Reference(), Port(), (activations(),), grads=grads)
    assert report.passed, format_report(report)
    assert {depth for side, dtype, depth in runs if dtype != torch.float64} == {1}, runs  # the port's early trace included
    assert {depth for side, dtype, depth in runs if dtype == torch.float64} == {0 if grads else 1}, runs
    assert {(side, str(dtype)) for side, dtype, _ in runs} == {("torch", str(torch.float32)), ("torch", str(torch.float64)), ("flax", "float32")}
    assert freed_memory._depth == 0


def test_every_malloc_policy_is_named_once_with_what_it_is_for():
    assert set(freed_memory.POLICIES) == {"settled", "kept", "never_unmapped", "returned"}
    for name, (settings, why) in freed_memory.POLICIES.items():
        assert settings and ":" in why, f"{name}: a policy says what it is for and which rows it justifies"
    with pytest.raises(KeyError):
        freed_memory.use("unnamed")
