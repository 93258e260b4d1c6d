"""The forward check, `check_port` (`check.py`): pair the parameters (`weights.py`, `name_map.py`),
run both models, fill the rows (`rows.py`) under tolerances derived from each side's float32 error
(`derived.py`), gradients through a fixed random cotangent (`core/cotangents.py`), splits at another
module boundary (`boundaries.py`), precision findings (`precision.py`), hints and probes (`hints.py`)."""
