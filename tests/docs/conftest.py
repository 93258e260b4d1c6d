"""The transcript tests' marker: a document whose commands take more than a few seconds in all
(`<!-- transcripts: slow -->`) starts before the other tests of its session
(tests/machinery/scheduling.py)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "docs_slow: a document whose transcripts take more than a few seconds: started first")
