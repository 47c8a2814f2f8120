#!/usr/bin/env bash
# Every test: lint, the import layers, unit tests, widget tests on ipywidgets 7.7.1, and every notebook under nbval.
# Run through `make test` (which sets up the environment first). Prints how long each part took.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")

export LABKIT_PROFILE=ci TQDM_DISABLE=1 LABKIT_OFFLINE=1 MPLBACKEND=Agg PYTHONHASHSEED=0
# A fresh results cache each run, so no test passes on a stale cached result.
LABKIT_DATA_DIR=$(mktemp -d)
export LABKIT_DATA_DIR
trap 'rm -rf "$LABKIT_DATA_DIR"' EXIT

timings=()
failed=()
part() {
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name: $*"
  "$@"
  local status=$?
  timings+=("$(printf '%-22s %5ss  %s' "$name" $((SECONDS - start)) "$([ $status = 0 ] && echo ok || echo FAILED)")")
  [ $status = 0 ] || failed+=("$name")
}

part lint "$BIN/ruff" check .
part import-layers "$BIN/lint-imports"  # the engine's layers: [tool.importlinter] in pyproject.toml
part unit-tests "$PY" -m pytest tests -q -p no:cacheprovider
part widgets-ipywidgets7 bash tests/widgets_ipywidgets7.sh
part notebooks "$PY" -m pytest --nbval-lax --nbval-current-env -q -p no:cacheprovider notebooks/

echo
echo "Part timings:"
printf '  %s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED parts: ${failed[*]}"
  exit 1
fi
echo "All parts passed."
