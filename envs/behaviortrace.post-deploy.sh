#!/usr/bin/env bash
# Snakemake runs this inside the new conda environment once, after creating it: jobs import the
# behaviortrace package, so install it from this checkout (editable: code changes need no rebuild).
set -euo pipefail
pip install --no-deps -e "$(dirname "$0")/.."
# kronfluence and bergson declare torchvision (CUDA wheels that break a CPU torch) and never import it
# (pyproject.toml).
pip install --no-deps kronfluence==1.0.1 bergson==2.5.1
