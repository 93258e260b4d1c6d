"""The text the command prints: `forward.py` for a forward check's report, `training.py` for
`--train`'s."""
