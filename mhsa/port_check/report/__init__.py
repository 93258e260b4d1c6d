"""The text the command prints: `forward.py` for a forward check's report, `training.py` for
`--train`'s, `findings.py` for the line of each finding both show."""
