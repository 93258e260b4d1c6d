"""What both checks share and no framework knows: inputs and outputs of any structure
(`structure.py`), layouts (`layouts.py`), chunked comparison (`chunks.py`), Flax's 'SAME'
padding (`padding.py`) and the records a report is made of (`records.py`)."""
