"""Where the checkout under test is: the tests start processes in it and read its files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout whose packages are tested
