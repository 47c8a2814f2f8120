#!/usr/bin/env bash
# The GPU suite (labkit/bench/suite.py): every GPU-only measurement of notebooks 01-09 on this machine's GPU, in
# under 8 minutes, without the network. A GPU session runs exactly this, from the repository root:
#
#     bash benchmarks/gpu_suite.sh                  # or: bash benchmarks/gpu_suite.sh --budget-s 300 08_lora
#
# Reference files go to $OUT when it is set (a device session's folder that comes back), else to
# src/labkit/assets/reference/; commit them there with their summary (gpu_suite-summary-<gpu>-<date>.json).
# Exit status: 0 every part ran or said why not, 1 a part failed or timed out (its error is in the summary),
# 2 bad arguments, 143 stopped by SIGTERM (the summary still holds what finished).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
OUT_DIR="${OUT:-src/labkit/assets/reference}"
mkdir -p "$OUT_DIR"
export LABKIT_OFFLINE="${LABKIT_OFFLINE-1}"  # no downloads: `full` falls back (loudly) to the offline workload

# labkit only: torch, torchvision, pandas, pyyaml and tqdm come with the machine; no build isolation, which would
# fetch setuptools from the network. Where that fails, labkit runs from src/ all the same. GPU_SUITE_NO_INSTALL=1
# skips it (labkit already installed, e.g. in a shared environment).
if [ -n "${GPU_SUITE_NO_INSTALL:-}" ]; then
    :
elif ! "$PY" -m pip install --no-deps --no-build-isolation --quiet -e . ; then
    echo "gpu_suite.sh: 'pip install -e .' failed; running labkit from src/ instead" >&2
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - <<'PY'
import importlib.util
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs {torch.cuda.device_count()}:",
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
missing = [m for m in ("torchvision", "pandas", "yaml", "tqdm") if importlib.util.find_spec(m) is None]
optional = [m for m in ("bitsandbytes", "torchao", "peft", "transformers") if importlib.util.find_spec(m) is None]
print("missing (labkit needs them):", missing or "none", "| missing (their parts record why):", optional or "none")
PY
exec "$PY" -m labkit.cli bench --suite gpu --out "$OUT_DIR" "$@"
