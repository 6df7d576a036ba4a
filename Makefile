# Two commands do all set-up on a fresh machine (Python 3.11+):
#   make run    builds .venv if needed, runs the default pipeline (snakemake --cores all) and builds
#               its HTML report (results/default/report.html)
#   make test   builds .venv if needed, installs Chromium if missing, runs the linters, then side by side the test
#               suite, its numerically sensitive tests again under a second CPU capability, and the SLURM check
#               (needs root and apt-get: it installs SLURM and munge from Debian)
VENV ?= .venv
PYTHON ?= python3
# pytest on two workers (pytest-xdist); tests that share a module's fixture stay on one worker, and the long runs the
# tests share start in the background as soon as they are collected (tests/conftest.py).
PYTEST = $(VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup

.PHONY: run test lint docs pytest pytest-timed pytest-second-cpu test-slurm clean-results browser results-page paper-shape-page

run: $(VENV)/.installed
	$(VENV)/bin/snakemake --cores all
	$(VENV)/bin/snakemake --report results/default/report.html

# The test suite, its numerics rerun and the SLURM check run side by side (each prints its output when it ends): on two
# cores the SLURM check mostly waits for its scheduler, and the rerun, at a lower priority, fills the gaps. pytest
# lists its 15 costliest tests by CPU and by wall time at the end: where CI's time goes.
test: lint $(VENV)/.installed-test browser
	$(MAKE) --no-print-directory -j3 --output-sync=target pytest-timed pytest-second-cpu test-slurm

pytest-timed: $(VENV)/.installed-test browser
	$(PYTEST) --durations=15 --cpu-durations=15

# Style and workflow checks (ruff, snakefmt, Snakemake's own linter); fast, and part of make test.
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules
	$(VENV)/bin/snakemake --lint

# The config reference page, generated from the key definitions (a test fails when it is out of date).
docs: $(VENV)/.installed
	$(VENV)/bin/python -m behaviortrace.config.reference > docs/config.md

# The test suite alone.
pytest: $(VENV)/.installed-test browser
	$(PYTEST)

# The numerically sensitive tests again with torch's kernels for a lower CPU capability than this machine's
# (AVX-512 -> AVX2, AVX2 or anything else -> default), as another processor would run them: a tolerance that only
# one processor meets fails here (docs/reruns.md).
pytest-second-cpu: $(VENV)/.installed-test
	capability=$$($(VENV)/bin/python -c "import torch; print('avx2' if torch.backends.cpu.get_cpu_capability().startswith('AVX512') else 'default')") && \
	echo "numerics tests under ATEN_CPU_CAPABILITY=$$capability" && \
	ATEN_CPU_CAPABILITY=$$capability nice -n 10 $(PYTEST) -m numerics

# A reduced pipeline on a throwaway single-node SLURM cluster on this machine (installs and starts
# SLURM and munge; needs root and apt-get). See tests/slurm/run_cluster.sh.
test-slurm: $(VENV)/.installed-test
	VENV=$(VENV) tests/slurm/run_cluster.sh

# Headless Chromium renders the HTML report in a test (Debian's package; needs root or sudo once).
browser:
	@command -v chromium >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; }
	@chromium --version

# torch first and pinned, by pip, so that no installer resolves an unpinned (multi-GB CUDA) build on its own; the rest
# by uv (a third of pip's time), beside the torch already there. `make run` needs the package, its runtime dependencies
# and the peer libraries of the default estimators (kronfluence and bergson without the torchvision they declare:
# pyproject.toml); the test tools come with `make test`.
UV = $(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet torch==2.13.0 uv==0.13.10
	$(UV) -e ".[peers]"
	$(UV) --no-deps kronfluence==1.0.1 bergson==2.5.1
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(UV) -e ".[test,peers]"
	touch $@

# docs/results.md: the default run's results page (written by the workflow's results_page rule).
results-page: results/default/results.md
	cp results/default/results.md docs/results.md

# docs/paper_shape_results.md: the results page of config/paper_shape.yaml (docs/paper.md).
paper-shape-page: $(VENV)/.installed
	$(VENV)/bin/snakemake --cores all --configfile config/paper_shape.yaml
	cp results/paper_shape/results.md docs/paper_shape_results.md

clean-results:
	rm -rf results .snakemake
