"""Every transcript of the README and docs/ is what its commands print today (tests/docs/transcripts.py
says how they are read, run and compared). After a change that moves an output on purpose,
re-take them all with `make docs-update`, or one document with
`MHSA_DOCS_UPDATE=1 .venv/bin/python -m pytest tests/docs/test_transcripts.py -k NAME`, and
read the diff before committing it."""

import os

import pytest

from tests.docs import transcripts
from tests.paths import ROOT

UPDATE = os.environ.get("MHSA_DOCS_UPDATE") == "1"


def _params():
    for path in transcripts.documents():
        doc = transcripts.parse(path)
        if doc.commands:
            # every transcript runs commands in fresh processes: the slow tier (make test-slow); the slow documents start first
            yield pytest.param(path, id=doc.name, marks=[pytest.mark.slow, *([pytest.mark.docs_slow] if doc.slow else [])])


def test_every_command_block_is_a_transcript_or_says_why_it_is_not_run():
    problems = [problem for path in transcripts.documents() for problem in transcripts.parse(path).problems]
    assert not problems, "\n".join(problems)


def test_the_documents_scratch_folder_is_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert f"/{transcripts.SCRATCH}/" in ignored, f".gitignore does not ignore {transcripts.SCRATCH}/, where the documents' commands write"


@pytest.mark.parametrize("path", list(_params()))
def test_transcript(path):
    doc = transcripts.parse(path)
    written: list[str] = []
    outcomes = transcripts.run(doc, written=written)
    stray = [name for name in written if not name.startswith(transcripts.scratch(doc) + "/")]
    assert not stray, f"{doc.name}'s commands write outside {transcripts.scratch(doc)}/, the document's own scratch folder: {stray}"
    wrong = [outcome for outcome in outcomes if not outcome.ok]
    if UPDATE:
        exits = [outcome for outcome in wrong if outcome.status != outcome.command.exits]
        if exits:
            message = "an exit status is not re-taken: say it in the document (`# exits N`) if it is meant"
            pytest.fail(message + "\n\n" + "\n\n".join(outcome.report(doc) for outcome in exits), pytrace=False)
        new = transcripts.rewritten(doc, outcomes)
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
        return
    if wrong:
        message = f"{len(wrong)} of {len(outcomes)} commands of {doc.name} print something else than the document shows"
        hint = "(re-take with `make docs-update` if the change is meant)"
        pytest.fail(f"{message} {hint}:\n\n" + "\n\n".join(outcome.report(doc) for outcome in wrong), pytrace=False)
