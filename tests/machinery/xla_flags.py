"""XLA's quickest compile settings for the tests' JAX programs (conftest puts them into
XLA_FLAGS before JAX starts, so the tests' subprocesses inherit them).

The tests compile hundreds of small JAX programs, and compiling is most of a first session's
time. Two debug options of XLA's CPU backend make each compile several times quicker: LLVM at
-O0, and the loop emitters instead of the newer fusion emitters; a third has LLVM compile each
program whole rather than in 32 parts on a thread pool (a quarter less time per small program,
whose parts are tiny, and `make test`'s two workers already keep both cores busy). The programs
run slower, which the tests' sizes do not notice, and compute the same operations: the default
run's losses differ from those of XLA's defaults far less than the trajectory tolerances allow.
A user's run compiles with XLA's defaults, so one test trains the default run that way, in its
own process, and holds it to every trainer's (tests/implementations/test_jax_train.py).

Only the compiler's own passes change; JAX hashes XLA_FLAGS into its compilation cache
keys, so a program compiled this way is never read by a run without them. The options are
debug options of the jaxlib pinned in constraints.txt: a jaxlib without one of them aborts the
tests at JAX's first use with XLA's fatal "Unknown flag in XLA_FLAGS", so a jaxlib upgrade checks
them first.
"""

QUICK_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")


def with_quick_compile(flags: str) -> str:
    """`flags` (an XLA_FLAGS value) with QUICK_COMPILE added where its option is not set."""
    given = flags.split()
    names = {flag.split("=")[0] for flag in given}
    return " ".join(given + [flag for flag in QUICK_COMPILE if flag.split("=")[0] not in names])


def without_quick_compile(flags: str) -> str:
    """`flags` with QUICK_COMPILE taken out: XLA's defaults, as users compile."""
    return " ".join(flag for flag in flags.split() if flag not in QUICK_COMPILE)
