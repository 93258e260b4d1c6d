"""XLA's quickest compile settings for the tests' JAX programs (conftest puts them into
XLA_FLAGS before JAX starts, so the tests' subprocesses inherit them).

A first session compiles about 900 JAX programs, and compiling was most of its time (142 s
of the two workers' 253 s). Two debug options of XLA's CPU backend make each compile about 5x
quicker (the scanned epoch of a small run: 1.0 s -> 0.2 s): LLVM at -O0, and the loop emitters
instead of the newer fusion emitters. The programs run 2.2-2.6x slower, which the tests' sizes
do not notice, and compute the same operations: over the 192 losses of the default run they
differ from XLA's defaults by at most 7.2e-7 in float32 and 4.4e-16 in float64, far inside the
trajectory tolerances (1e-4, 1e-10). A user's run compiles with XLA's defaults, so one test
trains the default run that way, in its own process, and holds it to every trainer's
(test_jax_speed_paths.py).

Only the compiler's own passes change; JAX hashes XLA_FLAGS into its compilation cache
keys, so a program compiled this way is never read by a run without them. Both options are
debug options of the jaxlib pinned in constraints.txt: a jaxlib without one of them aborts the
tests at JAX's first use with XLA's fatal "Unknown flag in XLA_FLAGS", so a jaxlib upgrade checks
them first.
"""

QUICK_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def with_quick_compile(flags: str) -> str:
    """`flags` (an XLA_FLAGS value) with QUICK_COMPILE added where its option is not set."""
    given = flags.split()
    names = {flag.split("=")[0] for flag in given}
    return " ".join(given + [flag for flag in QUICK_COMPILE if flag.split("=")[0] not in names])


def without_quick_compile(flags: str) -> str:
    """`flags` with QUICK_COMPILE taken out: XLA's defaults, as users compile."""
    return " ".join(flag for flag in flags.split() if flag not in QUICK_COMPILE)
