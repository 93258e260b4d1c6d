"""`mhsa diff`: two backends' versions of one file in two columns, aligned step by step.

One job per module, each usable (and tested) on its own:

- sections.py: split one file's lines into sections (preamble, class/function/method,
  numbered step comment `# 5. mask: ...`, module-level code). Pure, on strings.
- align.py: pair two files' sections and align the lines inside each pair (rows). Pure.
- render_text.py: plain text (what a pipe gets), and the wrapping the terminal shares.
- render_rich.py: the same rows with colour on a terminal (rich).
- render_html.py: one self-contained HTML page (pygments colours, page.css inlined).
- command.py: the `mhsa diff NAME [--left B] [--right B]` command; the files come from
  mhsa.registry (`<package>/NAME.py` of each backend).
"""
