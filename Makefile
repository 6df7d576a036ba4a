# Two commands do all set-up on a fresh machine (Python 3.11+):
#   make run    builds .venv if needed, then runs the default pipeline (snakemake --cores all)
#   make test   builds .venv if needed, then runs the test suite and the SLURM check (root, Debian)
VENV ?= .venv
PYTHON ?= python3

.PHONY: run test pytest test-slurm clean-results

run: $(VENV)/.installed
	$(VENV)/bin/snakemake --cores all

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider
	VENV=$(VENV) tests/slurm/run_cluster.sh

# The test suite alone.
pytest: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

# A reduced pipeline on a throwaway single-node SLURM cluster on this machine (installs and starts
# SLURM and munge; needs root and apt-get). See tests/slurm/run_cluster.sh.
test-slurm: $(VENV)/.installed
	VENV=$(VENV) tests/slurm/run_cluster.sh

# torch first and pinned, so that pip never resolves an unpinned (multi-GB CUDA) build on its own.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e ".[test]"
	touch $@

clean-results:
	rm -rf results .snakemake
