#!/usr/bin/env bash
# Run tests/test_widgets.py under ipywidgets 7.7.1 (what Colab ships), next to the venv's ipywidgets 8.
#
# ipywidgets 7.7.1 and the packages of its stack that differ from ipywidgets 8's are installed with
# --no-deps into a cached folder (.ci-cache/ipywidgets7, reused when present) that goes first on
# PYTHONPATH; everything else (ipykernel, IPython, traitlets, comm) comes from the interpreter's env.
#   widgetsnbextension 3.6.1 and jupyterlab_widgets 1.1.1: the front-end packages released with 7.7.1
#   (never imported by the Python side; installed so the stack matches a 7.7.1 install);
#   ipython_genutils 0.2.0: imported by ipywidgets 7, dropped by 8.
# Usage: tests/widgets_ipywidgets7.sh [extra pytest args]      (PYTHON=... to choose the interpreter)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
TARGET=".ci-cache/ipywidgets7"
PACKAGES=(ipywidgets==7.7.1 widgetsnbextension==3.6.1 jupyterlab_widgets==1.1.1 ipython_genutils==0.2.0)
STAMP="$TARGET/.installed"

if [[ ! -f "$STAMP" ]] || [[ "$(cat "$STAMP")" != "${PACKAGES[*]}" ]]; then
    rm -rf "$TARGET"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$TARGET" "${PACKAGES[@]}"
    echo "${PACKAGES[*]}" > "$STAMP"
fi

export PYTHONPATH="$TARGET:${PYTHONPATH:+$PYTHONPATH:}src"
"$PYTHON" - <<'PY'
import ipywidgets

assert ipywidgets.__version__ == "7.7.1", f"expected ipywidgets 7.7.1, got {ipywidgets.__version__} from {ipywidgets.__file__}"
print(f"ipywidgets {ipywidgets.__version__} from {ipywidgets.__file__}")
PY
# ipywidgets 7 creates comms through ipykernel's deprecated Comm class: expected here, not our concern.
exec "$PYTHON" -m pytest tests/test_widgets.py \
    -W "ignore:The \`ipykernel.comm.Comm\` class has been deprecated:DeprecationWarning" "$@"
