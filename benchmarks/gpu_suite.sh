#!/usr/bin/env bash
# The GPU suite (labkit/bench/suite.py): every GPU-only measurement of notebooks 01-10 on this machine's GPU, within
# a 450 s budget, without the network. A GPU session runs exactly this, from the repository root, after
# `bash benchmarks/gpu_wheels.sh` here (the wheels travel in .whl/, git-ignored: a device call names .whl in carry):
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
# No downloads: without CIFAR-10 in data/cache the vision parts run a labelled stand-in (labkit.bench.suite_workloads)
export LABKIT_OFFLINE="${LABKIT_OFFLINE-1}"

# Wheels carried in .whl/ (benchmarks/gpu_wheels.sh: bitsandbytes, torchao, ipywidgets and what that machine lacks of
# their dependencies) go into a temporary folder on PYTHONPATH: nothing is fetched, the machine's packages stay.
if compgen -G ".whl/*.whl" >/dev/null; then
    SITE="$(mktemp -d)/site"
    if "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .whl/*.whl; then
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        echo "gpu_suite.sh: $(ls .whl/*.whl | wc -l) wheels from .whl/ installed in $SITE"
    else
        echo "gpu_suite.sh: installing .whl/*.whl failed; their parts record what is missing" >&2
    fi
fi

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
optional = [m for m in ("bitsandbytes", "torchao", "peft", "transformers", "ipywidgets")
            if importlib.util.find_spec(m) is None]
print("missing (labkit needs them):", missing or "none", "| missing (their parts record why):", optional or "none")
PY
exec "$PY" -m labkit.cli bench --suite gpu --out "$OUT_DIR" "$@"
