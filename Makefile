# Two commands do all the set-up: `make demo` (install + train every backend) and `make test`.
#   make demo PYTHON=python3.12             another interpreter (3.11 or newer)
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
#                                           the CPU build of torch on a machine where PyPI's
#                                           torch wheel is the multi-GB CUDA one (plain Linux)
#   make demo PIP_ARGS="--index-url ..."     anything else pip needs on your machine
PYTHON ?= python3
TORCH_INDEX ?=
PIP_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_LOG := $(VENV)/pip-install.log
INDEX := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: install demo test lint bench clean

# pip's own output goes to a log, shown only when the install fails
$(STAMP): pyproject.toml constraints.txt
	@echo "[1/2] creating $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)
	@echo "[2/2] installing the pinned versions of constraints.txt (torch, jax, flax, optax, ...): a minute or two"
	@$(PY) -m pip install --disable-pip-version-check $(INDEX) $(PIP_ARGS) -c constraints.txt -e ".[test,lint]" > $(PIP_LOG) 2>&1 \
		|| { cat $(PIP_LOG); echo "pip install failed: the log above is also in $(PIP_LOG)"; exit 1; }
	@touch $(STAMP)
	@echo "installed: $(VENV)/bin/mhsa --help lists every command"

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mhsa demo

# two pytest-xdist workers (a 2-core machine's), each module whole in one worker: its module-scoped
# fixtures (a default training run, say) are built once, not once per worker
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope

# the checks CI runs before the tests (without make: bash scripts/lint.sh)
lint: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/lint.sh

bench: $(STAMP)
	$(VENV)/bin/mhsa bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
