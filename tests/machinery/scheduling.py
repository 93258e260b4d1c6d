"""How a session's tests are spread over its xdist workers (`-n 2 --dist loadscope` in the Makefile).

loadscope keeps each module whole in one worker, so its module-scoped fixtures (a default training,
say) are built once, and hands out the modules with the most tests first. The slow tier's longest
tests are few to a module (one document's transcripts, a signal to a training process group): handed
out last, one of them would run alone while the other worker idles. So here:

- the modules of ONE_BY_ONE (no module-scoped fixtures) are handed out test by test, and first:
  the documents marked slow before the rest; then every other module, the one with the most tests
  first, as loadscope orders them.

Which test runs in which worker changes nothing a test sees: every test stands alone."""

import pytest

# modules whose tests share no module-scoped fixture and take seconds each
ONE_BY_ONE = ("tests/docs/test_transcripts.py", "tests/tools/test_interrupt.py")


def scope_of(nodeid: str) -> str | None:
    """The scope `nodeid` is handed out in when it is not its module: its own node id, or None."""
    return nodeid if nodeid.split("::", 1)[0] in ONE_BY_ONE else None


def ordered(items: list[pytest.Item]) -> list[pytest.Item]:
    """items in the order their scopes are handed out (the order within a module is kept)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    first = [item for module in ONE_BY_ONE for item in modules.get(module, [])]
    first.sort(key=lambda item: item.get_closest_marker("docs_slow") is None)  # stable: the slow documents first
    rest = [module for module in modules if module not in ONE_BY_ONE]
    rest.sort(key=lambda module: -len(modules[module]))  # stable
    return first + [item for module in rest for item in modules[module]]


def make_scheduler(config, log):
    """loadscope with ONE_BY_ONE's tests as scopes of their own and the collection's order kept."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # ordered() has ordered the collection
    return Scheduling(config, log)
