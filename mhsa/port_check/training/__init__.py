"""The check through training, `check_training` (`check.py`): both sides train N steps from the
reference's weights and every step's loss, gradients, moments and parameters are compared
(`records.py`) under tolerances from each side's float64 run (`tolerances.py`), after an optimizer
lint (`lint.py`); `../training_command.py` is `mhsa port-check --train`."""
