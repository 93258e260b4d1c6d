"""core/memory.py: what the machine can still give, read from files that may be absent, malformed
or say there is no limit; never a guess."""

from mhsa.port_check.core import memory


def _machine(monkeypatch, tmp_path, meminfo=None, cgroup=None, limit=None, current=None):
    """memory's files under tmp_path: each given one written, the others absent."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = {"MEMINFO": tmp_path / "meminfo", "SELF": tmp_path / "self_cgroup", "CGROUP": tmp_path / "fs"}
    for name, path in paths.items():
        monkeypatch.setattr(memory, name, path)
    if meminfo is not None:
        paths["MEMINFO"].write_text(meminfo)
    if cgroup is not None:
        paths["SELF"].write_text(cgroup)
        group = paths["CGROUP"] / "job"
        group.mkdir(parents=True)
        for name, value in (("memory.max", limit), ("memory.current", current)):
            if value is not None:
                (group / name).write_text(value)


def test_what_is_available_is_the_smaller_of_the_machines_and_its_cgroups(monkeypatch, tmp_path):
    _machine(monkeypatch, tmp_path, "MemTotal: 100 kB\nMemAvailable:   2048 kB\n", "0::/job\n", "1500\n", "1000\n")
    assert memory.available() == 500
    _machine(monkeypatch, tmp_path / "b", "MemAvailable: 2 kB\n", "0::/job\n", "100000\n", "1000\n")
    assert memory.available() == 2048


def test_no_limit_an_absent_file_or_a_malformed_one_reads_as_unknown_not_as_a_number(monkeypatch, tmp_path):
    _machine(monkeypatch, tmp_path, "MemAvailable: 4 kB\n", "0::/job\n", "max\n", "1000\n")
    assert memory.available() == 4096  # "max": no limit, the machine's figure alone
    _machine(monkeypatch, tmp_path / "b", "MemAvailable: lots\n", "1:cpu:/job\n")
    assert memory.available() is None  # no v2 line, a value that is no number
    _machine(monkeypatch, tmp_path / "c")
    assert memory.available() is None
    _machine(monkeypatch, tmp_path / "d", None, "0::/job\n", "100\n", "900\n")
    assert memory.available() == 0  # over its limit already: nothing left, not a negative number


def test_sizes_are_said_in_the_largest_unit_that_fits():
    assert (memory.size(18.4 * 2**30), memory.size(5 * 2**20), memory.size(3000)) == ("18.4 GiB", "5 MiB", "3 KiB")
