# Two commands a fresh machine needs (README, "Quick start"):
#   make serve   # a local kvmesh cluster on an embedded default model
#   make test    # the whole test suite
#   make test-quick   # the inner loop's tier: no Ray, no live server, nothing slow (tests/tiers.py)
# Each creates .venv and installs the project into it on first use.

PYTHON ?= python3
VENV ?= .venv
# torch is installed before the project so that pip never pulls a CUDA build onto a
# CPU-only machine. TORCH_SPEC picks the build; set TORCH_INDEX to a wheel index
# (e.g. PyTorch's CPU index) if your default index would serve a CUDA build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# engine: torch, Ray, transformers, plots (what `kvmesh serve` needs); dev: the test tools.
# `pip install .` without extras is the torch-free router / events / simulator install.
EXTRAS ?= engine,dev
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvmesh-installed

.PHONY: serve test test-quick lint typecheck install clean

serve: $(STAMP)
	@echo "make serve: kvmesh serve $(ARGS) (Ctrl-C stops it; the first start builds the embedded model)"
	$(BIN)/kvmesh serve $(ARGS)

# Test processes (pytest-xdist; each test file runs whole in one, with its own Ray where it needs one; the
# longest files are handed out first: tests/file_order.py).
# TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# Python's bytecode cache on for the run, whatever the environment says (PYTHONDONTWRITEBYTECODE set, as some
# containers do): without it each test process compiles every test module again (pytest's assertion rewrite: about
# half of collecting) and each server the tests start compiles kvmesh again. The cache goes to __pycache__/ (ignored).
PYCACHE_ON := PYTHONDONTWRITEBYTECODE=

# --durations: the slowest tests named at the end, where a slow suite is read.
test: $(STAMP)
	$(PYCACHE_ON) $(BIN)/python -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

test-quick: $(STAMP)
	$(PYCACHE_ON) $(BIN)/python -m pytest $(XDIST) -m "not ray and not live and not slow" $(PYTEST_ARGS)

lint: $(STAMP) typecheck
	$(BIN)/ruff check .

# The packages mypy checks ([tool.mypy] in pyproject.toml). They install as kvmesh.<folder> (setup.py); mypy finds
# them through links under build/typecheck/kvmesh/, replica/ and cluster/ too for what the checked ones import.
TYPED ?= kvcache events router
typecheck: $(STAMP)
	@mkdir -p build/typecheck/kvmesh
	@for top in kvcache events replica router cluster; do ln -sfn ../../../$$top build/typecheck/kvmesh/$$top; done
	$(BIN)/mypy $(addprefix -p kvmesh.,$(TYPED))

install: $(STAMP)

# The first install takes minutes (torch and Ray are large downloads): a line per step, and pip's own progress for
# the two big ones.
INSTALL_START := $(shell date +%s)
$(STAMP): pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "kvmesh needs Python >= 3.10, found " + sys.version.split()[0]'
	@echo "install 1/4: a virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "install 2/4: pip, setuptools and wheel up to date"
	@$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	@echo "install 3/4: $(TORCH_SPEC), the largest download (pip shows its progress)"
	@$(BIN)/python -m pip install --progress-bar on "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	@echo "install 4/4: kvmesh and its extras $(EXTRAS) (Ray, transformers, the test tools)"
	@$(BIN)/python -m pip install --progress-bar on -e ".[$(EXTRAS)]"
	@touch $(STAMP)
	@echo "install: done in $$(( $$(date +%s) - $(INSTALL_START) ))s; the CLI is $(BIN)/kvmesh"

clean:
	rm -rf $(VENV) build *.egg-info
