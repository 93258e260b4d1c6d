"""`mhsa diff NAME [--left B] [--right B]`: the command on a fake checkout (the fixture pair
as attention.py) and on the real files: which files it reads (from the registry), its
three outputs, and its one-line errors."""

import html
import re
from pathlib import Path

import pytest

from mhsa import cli, registry
from mhsa.diff import command
from mhsa.diff.align import pair_sections
from mhsa.diff.render_html import render_html
from mhsa.diff.render_text import CONTINUED, columns
from mhsa.diff.sections import split_sections
from tests.tools.diff_fixtures import ANSI, FLAX, NUMPY, TORCH, lines

LEFT, RIGHT = command.default_sides()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A fake checkout holding the fixture files as attention.py of each backend's package."""
    for name, text in ((LEFT, TORCH), (RIGHT, FLAX), ("numpy", NUMPY)):
        folder = tmp_path / registry.get(name).package
        folder.mkdir()
        (folder / "attention.py").write_text(text)
    monkeypatch.setattr(command, "repo_root", lambda: tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    return tmp_path


def test_without_left_and_right_it_shows_torch_beside_jax_as_the_readme_says(capsys):
    assert cli.main(["diff", "attention", "--width", "100", "--color", "never"]) == 0
    heading = capsys.readouterr().out.splitlines()[0]
    assert 0 <= heading.index("torch_impl/attention.py") < heading.index("jax_impl/attention.py"), heading


def test_plain_output_when_piped(repo, capsys):
    assert cli.main(["diff", "attention", "--width", "100"]) == 0
    out = capsys.readouterr().out
    assert not ANSI.search(out)
    text_lines = out.splitlines()
    assert all(len(line) <= 100 for line in text_lines)
    assert "torch_impl/attention.py" in text_lines[0] and "jax_impl/attention.py" in text_lines[0]
    assert any(re.search(r"## 1\. project: one matmul makes Q, K and V +=", line) for line in text_lines)
    assert any(re.search(r"## \(not in torch_impl\) += +## class CausalMask", line) for line in text_lines)
    markers = {line[columns([], 100)[0] + 1 + columns([], 100)[1] + 1] for line in text_lines[1:-2] if line.strip()}
    assert markers == {"|", "*", "<", ">", "="}
    assert CONTINUED in out  # the long register_buffer line is wrapped visibly, not dropped
    assert "persistent=False)" in out
    assert "sections" in text_lines[-1] and "changed" in text_lines[-1]


def test_html_page_is_self_contained_with_an_index(repo, tmp_path, capsys):
    target = tmp_path / "out" / "page.html"
    target.parent.mkdir()
    assert cli.main(["diff", "--html", str(target)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = target.read_text()
    assert [p.name for p in target.parent.iterdir()] == ["page.html"]  # no temporary left behind
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for external in ("http://", "https://", "src=", "<link", "@import", "url(", "<script"):
        assert external not in page
    assert "<style>" in page
    for left, right in ((left, right) for left, right in pair_sections(split_sections(lines(TORCH)), split_sections(lines(FLAX)))):
        title = (left or right).title
        assert re.search(rf'<a href="#s\d+">[^<]*{re.escape(html.escape(title))}', page), title
    anchors = re.findall(r'<a href="#(s\d+)">', page)
    assert anchors and all(f'id="{a}"' in page for a in anchors)
    assert '<tr class="changed">' in page and '<tr class="right-only">' in page
    assert '<span class="n">jnp</span></mark>' in page or "<mark>jnp</mark>" in page
    assert '<td class="ln l">21</td>' in page  # line numbers
    assert 'class="k"' in page  # pygments token classes, styled by the embedded stylesheet
    assert "td.code .k {" in page


def test_unknown_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diff", "atention"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'atention'" in err
    for name in ("attention", "model", "train", "generate", "parallel"):
        assert name in err


def test_missing_file_is_a_clear_error_that_names_the_backends_that_have_it(repo, capsys):
    (repo / "jax_impl" / "attention.py").unlink()
    assert cli.main(["diff", "attention"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "jax_impl/attention.py not found" in err
    assert "(attention.py is in numpy, torch: choose two with --left and --right)" in err


def test_the_choices_are_the_files_two_backends_share_on_disk(repo, capsys):
    """A file added to two packages (a speed module, say) is a choice without a change to the
    command; a file of one package, and the packages' __init__.py, are not."""
    for package in ("torch_impl", "jax_impl"):
        (repo / package / "speed.py").write_text(TORCH if package == "torch_impl" else FLAX)
        (repo / package / "__init__.py").write_text("")
    (repo / "numpy_ref" / "backward.py").write_text(NUMPY)
    assert list(command.shared_files()) == ["attention", "speed"]
    assert command.shared_files()["speed"] == [LEFT, RIGHT]
    assert cli.main(["diff", "speed", "--width", "100"]) == 0
    assert "torch_impl/speed.py" in capsys.readouterr().out.splitlines()[0]
    for refused in ("backward", "__init__"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["diff", refused])
        assert exit_info.value.code == 2 and f"invalid choice: '{refused}'" in capsys.readouterr().err


def test_help_names_the_backends_that_have_each_file(repo, capsys):
    (repo / "torch_impl" / "speed.py").write_text(TORCH)
    (repo / "jax_impl" / "speed.py").write_text(FLAX)
    with pytest.raises(SystemExit):
        cli.main(["diff", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"attention: numpy, {LEFT}, {RIGHT}; speed: {LEFT}, {RIGHT}" in help_text


def test_too_narrow_width_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diff", "--width", "10"])
    assert exit_info.value.code == 2
    assert "expected a width of at least 40" in capsys.readouterr().err


def test_every_file_the_implementations_share_is_a_choice():
    root = Path(command.repo_root())
    packages = {name: {path.stem for path in (root / registry.get(name).package).glob("*.py")} - {"__init__"} for name in registry.names()}
    shared = {stem for a in packages for b in packages if a != b for stem in packages[a] & packages[b]}
    assert set(command.shared_files()) == shared and {"attention", "model", "train", "generate", "parallel"} <= shared


@pytest.mark.parametrize("name, sides", list(command.shared_files().items()))
def test_the_real_files_render(name, sides, capsys):
    left, right = (LEFT, RIGHT) if {LEFT, RIGHT} <= set(sides) else sides[:2]
    root = Path(command.repo_root())
    paths = [root / registry.get(side).package / f"{name}.py" for side in (left, right)]
    assert cli.main(["diff", name, "--left", left, "--right", right, "--width", "160", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert not ANSI.search(out) and "sections" in out.splitlines()[-1]
    page = render_html(*(command.read_lines(path) for path in paths), "a", "b")
    assert "https://" not in page and "src=" not in page


def test_html_that_cannot_be_written_is_a_clear_error(repo, tmp_path, capsys):
    folder = tmp_path / "pages"
    folder.mkdir()
    assert cli.main(["diff", "--html", str(folder)]) == 2  # a folder, not a file
    assert "cannot write" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and not list(tmp_path.glob(".*.tmp"))
    assert cli.main(["diff", "--html", str(tmp_path / "missing" / "page.html")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_numpy_beside_torch_lines_up_the_steps(repo, capsys):
    assert cli.main(["diff", "attention", "--left", "numpy", "--right", LEFT, "--width", "160"]) == 0
    out = capsys.readouterr().out
    heading = out.splitlines()[0]
    assert "numpy_ref/attention.py" in heading and f"{registry.get(LEFT).package}/attention.py" in heading
    for title in ("1. project: one matmul makes Q, K and V", "2. split", "5. softmax over keys", "6. merge heads"):
        assert re.search(rf"## {re.escape(title)} += +## {re.escape(title)}$", out, re.MULTILINE), title
    assert re.search(r"\d+ numpy only, \d+ torch only$", out.splitlines()[-1])


def test_the_real_numpy_reference_lines_up_with_each_framework(capsys):
    root = Path(command.repo_root())
    numpy_file = root / registry.get("numpy").package / "attention.py"
    assert numpy_file.is_file(), f"{numpy_file} is missing"
    for framework in (LEFT, RIGHT):
        assert cli.main(["diff", "attention", "--left", "numpy", "--right", framework, "--width", "400", "--color", "never"]) == 0
        out = capsys.readouterr().out
        steps = re.findall(r"^ +## (\d+\. [^=]*?) += +## (\d+\. .*)$", out, re.MULTILINE)
        numbered = [left.strip() for left, right in steps if left.strip() == right.strip()]
        assert len(numbered) >= 9, (framework, steps)  # 1. project ... 9. project out


def test_unknown_backend_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diff", "attention", "--left", "tensorflow"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'tensorflow'" in err
    for name in registry.names():
        assert name in err


def test_the_same_backend_twice_is_refused(repo, capsys):
    assert cli.main(["diff", "--left", RIGHT, "--right", RIGHT]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"both {RIGHT}" in err


def test_a_file_missing_in_one_backend_is_named(repo, capsys):
    (repo / "numpy_ref" / "attention.py").unlink()
    assert cli.main(["diff", "attention", "--left", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line
    assert "numpy_ref/attention.py not found" in err and "jax_impl" not in err


def test_html_title_names_sides_that_are_not_the_default(repo, tmp_path, capsys):
    target = tmp_path / "page.html"
    assert cli.main(["diff", "--left", "numpy", "--right", RIGHT, "--html", str(target)]) == 0
    assert "numpy only" in capsys.readouterr().out
    page = target.read_text()
    assert f"<title>mhsa diff attention --left numpy --right {RIGHT}</title>" in page


def test_the_html_page_is_never_written_over_a_file_it_shows(repo, capsys):
    source = repo / "torch_impl" / "attention.py"
    before = source.read_bytes()
    assert cli.main(["diff", "attention", "--html", str(source)]) == 2
    assert "is the input torch_impl/attention.py" in capsys.readouterr().err
    assert source.read_bytes() == before
