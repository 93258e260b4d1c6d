"""The --inputs contract: a tiny --inputs file cannot demand terabytes.

Every array's declared size is checked against the bound before anything is allocated: a .npy
header, each member of a .npz, and the sum of a .npz's members (a zip bomb). A .npz gives
positional arguments (arr_0, arr_1, ...) and keyword arguments (every other name)."""

import io
import zipfile

import numpy as np

from mhsa.cli import main as mhsa
from tests.tools.port_check import models

FACTORIES = ["examples.torch_block:block", "examples.flax_block:block"]


def header_only(shape, descr="<f4", size=192) -> bytes:
    """A .npy file of `size` bytes whose header declares `shape`: the data is not there."""
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": descr, "fortran_order": False, "shape": shape})
    return stream.getvalue().ljust(size, b"\0")


def refused(argv, capsys) -> str:
    assert mhsa(["port-check", *FACTORIES, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mhsa port-check: error: "), err  # one line: no usage, no traceback
    return err.splitlines()[-1]


def test_a_192_byte_npy_declaring_four_tebibytes_is_refused_before_any_allocation(tmp_path, capsys):
    bomb = tmp_path / "bomb.npy"
    bomb.write_bytes(header_only((2**20, 2**20)))
    assert bomb.stat().st_size == 192
    line = refused(["--inputs", str(bomb)], capsys)
    assert line.endswith("declares shape (1048576, 1048576) float32: 4.00 TiB, more than the 1.00 GiB bound on inputs"), line


def test_a_npz_member_declaring_too_much_and_a_npz_whose_members_sum_past_the_bound_are_refused(tmp_path, capsys, monkeypatch):
    member = tmp_path / "member.npz"
    with zipfile.ZipFile(member, "w") as archive:
        archive.writestr("arr_0.npy", header_only((2**20, 2**20)))
    assert "member 'arr_0.npy' declares shape (1048576, 1048576) float32: 4.00 TiB" in refused(["--inputs", str(member)], capsys)
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, np.zeros(100, np.float32), np.zeros(100, np.float32))  # 2 x 528 bytes unpacked, a few compressed
    from mhsa.port_check import files

    monkeypatch.setattr(files, "INPUT_BYTES", 1000)  # each member fits, their sum does not
    assert "declares 1.03 KiB once unpacked, more than the 1000 bytes bound on inputs" in refused(["--inputs", str(bomb)], capsys)


def test_a_truncated_npy_and_a_bfloat16_npy_are_refused_in_one_line(tmp_path, capsys):
    truncated = tmp_path / "truncated.npy"
    truncated.write_bytes(header_only((3, 5, 24)))
    assert "is truncated: its header declares 1440 bytes of data, it holds 64" in refused(["--inputs", str(truncated)], capsys)
    void = tmp_path / "void.npy"
    void.write_bytes(header_only((3,), descr="|V2", size=134))
    assert "it holds dtype |V2 (a bfloat16 array saved by NumPy loses its type: save it as float32)" in refused(["--inputs", str(void)], capsys)


def test_a_npz_gives_positional_and_keyword_arguments(tmp_path, capsys):
    path = tmp_path / "inputs.npz"
    inputs = models.keyword_inputs()
    np.savez(path, inputs["x"], mask=inputs["mask"])
    from mhsa.port_check import read_input_file

    read = read_input_file(str(path))
    assert len(read.args) == 1 and list(read.kwargs) == ["mask"]
    np.testing.assert_array_equal(read.kwargs["mask"], inputs["mask"])
    structured = ["tests.tools.port_check.models:torch_structured", "tests.tools.port_check.models:flax_structured"]
    assert mhsa(["port-check", *structured, "--inputs", str(path), "--no-probes"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_npz_positional_members_must_not_have_gaps(tmp_path, capsys):
    path = tmp_path / "gap.npz"
    np.savez(path, arr_0=np.zeros(3), arr_2=np.zeros(3))
    assert "positional members must be arr_0, arr_1, ... without gaps; got arr_0, arr_2" in refused(["--inputs", str(path)], capsys)


def test_a_npz_with_more_members_than_one_call_takes_or_a_member_that_is_no_keyword_is_refused(tmp_path, capsys, monkeypatch):
    from mhsa.port_check import files

    many = tmp_path / "many.npz"
    np.savez(many, *[np.zeros(2)] * 5)
    monkeypatch.setattr(files, "MEMBERS", 4)
    assert "holds 5 arrays, more than the 4 arguments one call takes" in refused(["--inputs", str(many)], capsys)
    odd = tmp_path / "odd.npz"
    np.savez(odd, **{"not a name": np.zeros(2)})
    assert "member 'not a name' is neither arr_N nor a keyword argument's name" in refused(["--inputs", str(odd)], capsys)
