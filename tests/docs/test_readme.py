"""The README is what a newcomer reads in five minutes and every pointer in it and in docs/ leads
somewhere: the Quick start's two commands, at most 300 lines, every relative link and anchor,
every `mhsa diff NAME` and every section the porter's table names in a diff."""

import re

import pytest

from mhsa import cli
from mhsa.diff import command
from tests.docs import transcripts
from tests.paths import ROOT

README = ROOT / "README.md"
GUIDES = ("training", "parity", "generation", "data-parallel", "port-check", "performance", "contributing")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DIFF_POINTER = re.compile(r"`mhsa diff ([a-z_]+)`((?:(?:, |: )`[^`]+`)*)")


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make demo" in quick_start and "make test" in quick_start and "make clean" in quick_start


def test_the_readme_links_every_guide():
    links = set(LINK.findall(README.read_text(encoding="utf-8")))
    assert {f"docs/{guide}.md" for guide in GUIDES} <= links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


@pytest.mark.parametrize("path", transcripts.documents(), ids=lambda path: path.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(path):
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def _pointers():
    """(document, file, [section names]) for every `mhsa diff NAME` of the README and docs/."""
    for path in transcripts.documents():
        for name, sections in DIFF_POINTER.findall(path.read_text(encoding="utf-8")):
            yield path.name, name, re.findall(r"`([^`]+)`", sections)


def _titles(name: str, capsys) -> set[str]:
    """The section titles `mhsa diff NAME` shows, on either side, `def `/`class ` dropped."""
    assert cli.main(["diff", name, "--width", "400", "--color", "never"]) == 0
    titles = set()
    for left, right in re.findall(r"^ +## (.*?) += +## (.*)$", capsys.readouterr().out, re.MULTILINE):
        titles |= {re.sub(r"^(def|class) ", "", title.strip()) for title in (left, right)}
    return titles


@pytest.mark.parametrize("document, name, sections", list(_pointers()), ids=lambda value: value if isinstance(value, str) else None)
def test_every_pointer_into_the_diff_names_a_section_it_shows(document, name, sections, capsys):
    assert name in command.shared_files(), f"{document}: `mhsa diff {name}` is not a choice"
    titles = _titles(name, capsys)

    def shown(section: str) -> bool:
        return any(
            title == section or title.endswith("." + section) or title.startswith((section + ":", section + " ", section + "(")) for title in titles
        )

    assert [section for section in sections if not shown(section)] == [], sorted(titles)
