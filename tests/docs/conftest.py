"""The transcript tests' marker: a document marked slow (`<!-- transcripts: slow -->`) runs in
`make docs` (`-m docs_slow`) and when re-taking (MHSA_DOCS_UPDATE=1), and is skipped otherwise."""

import os

import pytest

UPDATE = os.environ.get("MHSA_DOCS_UPDATE") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "docs_slow: a document whose transcripts take more than a few seconds; `make docs` runs them")


def pytest_collection_modifyitems(config, items):
    if UPDATE or "docs_slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow transcripts: `make docs` runs them")
    for item in items:
        if item.get_closest_marker("docs_slow") is not None:
            item.add_marker(skip)
