#!/usr/bin/env bash
# The project's static checks, in the order CI runs them; each one fails the build.
# Run from anywhere: `make lint`, or `bash scripts/lint.sh` with ruff and mypy on PATH
# (pip install -c constraints.txt -e ".[lint]").
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check (pyflakes, pycodestyle, isort, bugbear, pyupgrade, NumPy rules)"
ruff check .
echo "lint: ruff format --check (the one formatting of the tree)"
ruff format --check .
echo "lint: mypy (types of shared/, numpy_ref/, torch_impl/, jax_impl/, mhsa/)"
mypy
