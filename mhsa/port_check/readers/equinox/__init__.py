"""The port check's Equinox reader (reader.py, with record.py: every submodule call's output
captured inside the traced program). Equinox is an optional extra: `pip install -e ".[equinox]"`."""
