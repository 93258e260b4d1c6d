"""The check through training, `check_training` (`check.py`): both sides train N steps from the
reference's weights and every step's loss, gradients, moments and parameters are compared
(`core/training_records.py`) under tolerances from each side's float64 run, after an optimizer
lint (`lint.py`); `../command.py` runs it as `mhsa port-check --train`."""
