"""tests/machinery/xla_flags.py: the tests' quick XLA compile settings are added to a caller's XLA_FLAGS
without overriding an option the caller set, and taken out again to compile as users do."""

import os

import pytest

from tests.machinery.xla_flags import QUICK_COMPILE, with_quick_compile, without_quick_compile


@pytest.mark.parametrize(
    "given, expected",
    [
        ("", " ".join(QUICK_COMPILE)),
        ("--xla_force_host_platform_device_count=4", " ".join(("--xla_force_host_platform_device_count=4", *QUICK_COMPILE))),
        ("--xla_backend_optimization_level=3", " ".join(("--xla_backend_optimization_level=3", *QUICK_COMPILE[1:]))),
        (" ".join(QUICK_COMPILE), " ".join(QUICK_COMPILE)),
    ],
)
def test_the_quick_settings_join_a_callers_flags_and_leave_its_own_choices(given, expected):
    assert with_quick_compile(given) == expected


def test_taking_them_out_leaves_every_other_flag():
    flags = with_quick_compile("--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false")
    assert without_quick_compile(flags) == "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
    assert without_quick_compile(with_quick_compile("")) == ""


def test_this_session_compiles_with_them_unless_the_caller_chose_those_options():
    names = {flag.split("=")[0] for flag in os.environ["XLA_FLAGS"].split()}
    assert {flag.split("=")[0] for flag in QUICK_COMPILE} <= names
