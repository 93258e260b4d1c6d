# Two commands do all the set-up: `make demo` (install + train every backend) and `make test`.
#   make demo PYTHON=python3.12             another interpreter (3.11 or newer)
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
#                                           the CPU build of torch on a machine where PyPI's
#                                           torch wheel is the multi-GB CUDA one (plain Linux)
#   make demo PIP_ARGS="--index-url ..."     anything else pip needs on your machine
# Changing one of the three installs again, into a fresh .venv; `make clean` removes it.
PYTHON ?= python3
TORCH_INDEX ?=
PIP_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
PIP_LOG := $(VENV)/pip-install.log
INDEX := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
# The stamp's name carries a checksum of the three variables, so a change of any of them is a
# missing stamp, and so an install; an install removes the stamps of other values (back to the
# old values installs again too). Quotes in the values are escaped for the shell.
INSTALL_ARGS := PYTHON=$(PYTHON) TORCH_INDEX=$(TORCH_INDEX) PIP_ARGS=$(PIP_ARGS)
STAMP := $(VENV)/.installed-$(firstword $(shell printf '%s' '$(subst ','\'',$(INSTALL_ARGS))' | cksum))

.PHONY: install demo test test-slow check docs docs-update lint bench bench-results clean

# pip's own output goes to a log, shown only when the install fails. pip compiles the installed
# files to bytecode on one core; compileall does it on every core (half the time on two), and a
# file that this Python cannot compile (torch's Python 3.12 test helpers) stays uncompiled, as
# pip leaves it (the list in .venv/compileall.log). A .venv installed with other values of the
# variables is made afresh (venv --clear): pip would keep a torch it finds installed whatever the
# index, and another interpreter's packages would stay behind.
$(STAMP): pyproject.toml constraints.txt
	@echo "[1/2] creating $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(if $(filter-out $(STAMP),$(wildcard $(VENV)/.installed*)),--clear )$(VENV)
	@echo "[2/2] installing the pinned versions of constraints.txt (torch, jax, flax, optax, ...): a minute or two"
	@$(PY) -m pip install --no-compile --disable-pip-version-check $(INDEX) $(PIP_ARGS) -c constraints.txt -e ".[test,lint,equinox]" > $(PIP_LOG) 2>&1 \
		|| { cat $(PIP_LOG); echo "pip install failed: the log above is also in $(PIP_LOG)"; exit 1; }
	@$(PY) -m compileall -q -j 0 $(VENV)/lib > $(VENV)/compileall.log 2>&1 || true
	@rm -f $(VENV)/.installed*
	@printf '%s\n' '$(subst ','\'',$(INSTALL_ARGS))' > $(STAMP)
	@echo "installed: $(VENV)/bin/mhsa --help lists every command"

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mhsa demo

# two pytest-xdist workers (a 2-core machine's), each module whole in one worker: its module-scoped
# fixtures (a default training run, say) are built once, not once per worker. `make test` is the
# fast tier: every test in this process, none marked slow (pyproject.toml says what is); the
# slow tier (commands in fresh processes, torch.compile and heavy XLA compilations, real
# trainings, every transcript) is `make test-slow`, scheduled longest first (tests/machinery/scheduling.py);
# `make docs` runs the transcripts alone; `make check` runs both tiers.
# pytest keeps each test module with its assertions rewritten as bytecode beside it, and reads it
# back next time; a shell that sets PYTHONDONTWRITEBYTECODE would have every worker of every session
# rewrite all of them again, so the tests' own runs write bytecode (__pycache__/, ignored by git)
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
test: $(STAMP)
	$(PYTEST) -q -n 2 --dist loadscope -m "not slow"

test-slow: $(STAMP)
	$(PYTEST) -q -n 2 --dist loadscope -m slow

# the transcripts of the README and docs/ (tests/docs/), one document per worker
docs: $(STAMP)
	$(PYTEST) -q -n 2 --dist loadscope -m slow tests/docs/test_transcripts.py

check: test test-slow

# every transcript re-taken: each command's real output written into its document
docs-update: $(STAMP)
	MHSA_DOCS_UPDATE=1 $(PYTEST) -q -n 2 --dist loadscope tests/docs/test_transcripts.py

# the checks CI runs before the tests (without make: bash scripts/lint.sh)
lint: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/lint.sh

bench: $(STAMP)
	$(VENV)/bin/mhsa bench

# every table of benchmarks/RESULTS.md measured again and written into its section
bench-results: $(STAMP)
	$(VENV)/bin/mhsa bench --write
	$(PY) benchmarks/parity_timing.py --write

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
