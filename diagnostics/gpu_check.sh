#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, a reduced workflow with a real-architecture model built here,
# train-time capture on, in float32, in bfloat16, in bfloat16 with LoRA adapters, and config/paper.yaml reduced to a
# few steps on a model of the paper's widths, within 9 minutes. Writes one summary file
# (OUT/gpu_check_summary.json: self-check errors, per-rule times and peak memory, peak GPU memory, failures) and exits
# non-zero on any failure, a missing GPU or a run past the time limit included. What it runs is diagnostics/gpu_check.py.
#
#   diagnostics/gpu_check.sh [OUT]          # default OUT: gpu_check_out (in the repository root)
#   diagnostics/gpu_check.sh --cpu [OUT]    # the same on the CPU, bf16 only (a dry run where there is no GPU)
#
# Needs the project's environment (make .venv/.installed-test; or set PYTHON to a Python that has it).
# GPU_CHECK_STEPS sets the GRPO steps of each reduced workflow (default 8, even).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device=cuda
dtypes=(float32 bfloat16)
budget=510  # seconds for the Python part; the hard limit below leaves it room to write its summary
if [[ "${1:-}" == "--cpu" ]]; then
    device=cpu
    dtypes=(bfloat16)
    budget=${GPU_CHECK_CPU_BUDGET:-900}
    shift
fi
out="$(mkdir -p "${1:-$here/gpu_check_out}" && cd "${1:-$here/gpu_check_out}" && pwd)"
summary="$out/gpu_check_summary.json"
python="${PYTHON:-$here/.venv/bin/python}"
rm -f "$summary"

fail() {  # a summary for a check that could not write its own
    printf '{\n "passed": false,\n "device": "%s",\n "failures": ["%s"]\n}\n' "$device" "$1" > "$summary"
    echo "gpu_check: FAILED: $1 (summary: $summary)" >&2
    exit 1
}

[[ -x "$python" ]] || fail "no Python at $python; run make .venv/.installed-test or set PYTHON"
if [[ "$device" == cuda ]] && ! command -v nvidia-smi >/dev/null; then
    fail "nvidia-smi not found: no CUDA GPU on this machine (use --cpu for a dry run)"
fi

timeout --kill-after=10 $((budget + 30)) \
    "$python" "$here/diagnostics/gpu_check.py" --out "$out" --device "$device" --dtypes "${dtypes[@]}" \
    --budget "$budget" --steps "${GPU_CHECK_STEPS:-8}"
code=$?
if [[ ! -s "$summary" ]]; then
    fail "gpu_check.py stopped (exit $code) before writing its summary"
fi
echo "gpu_check: summary in $summary"
exit $code
