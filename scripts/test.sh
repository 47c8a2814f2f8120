#!/usr/bin/env bash
# Every test: the setup (`make install`), lint, the import layers, unit tests, every notebook under nbval, every
# notebook again on `full`'s code path with its models shrunk (LABKIT_SHRINK), then every notebook in JupyterLab in
# headless Chromium (tests/browser: the learner's view, panels driven) with Colab's current image (Python 3.13, its
# torch, PEFT and old torchao, ipywidgets 7.7.1) tested beside it. Run through `make test`. Prints how long each part
# took.
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

# Colab's image (scripts/hosted_images.toml): its environment is built in the background from the start, beside the
# setup (whose pip leaves the second core mostly idle) and the parts after it; its tests run in the background beside
# the browser part, and the last part waits for them. The build needs only the standard library, so the host's Python
# runs it. Its logs: build/hosted-colab-build.log, build/hosted-colab-run.log.
mkdir -p build
# At a lower priority (nice): where it outlasts the setup, it takes what the unit tests leave rather than a core.
nice -n 10 "${HOST_PYTHON:-python3}" scripts/hosted_env.py colab --build-only > build/hosted-colab-build.log 2>&1 &
hosted_build=$!

part setup "${MAKE:-make}" install PYTHON="${HOST_PYTHON:-python3}"  # the venv's base Python, not $PYTHON (the venv's own)
if [ ${#failed[@]} -gt 0 ]; then
  printf '  %s\n' "${timings[@]}"
  echo "FAILED: the setup; nothing else can run"
  kill "$hosted_build" 2>/dev/null
  exit 1
fi

part lint "$BIN/ruff" check .
part import-layers "$BIN/lint-imports"  # the engine's layers: [tool.importlinter] in pyproject.toml
# Both cores: two pytest workers of one thread each (two workers of two threads each ran slower than one). A test
# file (--dist loadfile) or a notebook's cells (nbval needs them in order, in one kernel) stay on one worker.
XDIST=(-n 2 --dist loadfile)
# A notebook's kernel may take over nbval's default 60 s to answer while the other worker's notebook trains on both
# cores (07's torchrun jobs): seen once, on 2026-12-05, as every cell of 09 failing to start. Slow is not broken.
NBVAL=(--nbval-lax --nbval-current-env --nbval-kernel-startup-timeout=240)
part unit-tests env OMP_NUM_THREADS=1 "$PY" -m pytest tests -q -p no:cacheprovider --ignore=tests/browser \
  "${XDIST[@]}" --durations=15
# The notebooks with the named ones first (the longest first, so that neither worker is left with one at the end),
# then the rest in order; a notebook named with a leading "-" is left out, one named that does not exist (yet) too.
# They are handed out in this order (--no-loadscope-reorder): by default xdist sorts them by their number of cells,
# which put 07, the longest, eighth of eleven. (The unit tests keep xdist's order: their ~80 files end evenly.)
notebooks_in_order() {
  local chosen=() skip=() notebook prefix
  for prefix in "$@"; do [[ $prefix == -* ]] && skip+=("${prefix#-}"); done
  for notebook in $(for prefix in "$@"; do [[ $prefix == -* ]] || echo notebooks/"$prefix"_*.ipynb; done) \
      notebooks/[0-9][0-9]_*.ipynb; do
    [[ ! -e $notebook || " ${chosen[*]} " == *" $notebook "* || " ${skip[*]} " == *" ${notebook:10:2} "* ]] \
      || chosen+=("$notebook")
  done
  echo "${chosen[@]}"
}
# shellcheck disable=SC2046  # the notebooks' paths have no spaces
part notebooks env OMP_NUM_THREADS=1 "$PY" -m pytest "${NBVAL[@]}" -q -p no:cacheprovider \
  "${XDIST[@]}" --no-loadscope-reorder --durations=15 $(notebooks_in_order 07 09 11 06 02 08 10 01 03)
# `full`'s code path on the CPU: every notebook at the `full` profile with its models shrunk but keeping their
# architecture (labkit.env.FULL_SHRUNK: a couple of decoder layers with tied embeddings, GQA and Qwen's biases, the
# BatchNorm ResNet-18 at half width), random weights, offline. The shared data folder gives it nbval's tokenizers and
# generated data; its runs are cached apart (a shrunk result never stands in for `ci`'s: labkit.env.hardware_key).
# 07 is left out: on CPU processes its jobs take the small workload at `full` too (no SyncBatchNorm over gloo,
# labkit.labs.distributed.workload), the path nbval has just run.
full_shapes() {
  # shellcheck disable=SC2046
  env OMP_NUM_THREADS=1 LABKIT_PROFILE=full LABKIT_SHRINK=1 "$PY" -m pytest "${NBVAL[@]}" -q \
    -p no:cacheprovider "${XDIST[@]}" --no-loadscope-reorder --durations=10 \
    $(notebooks_in_order 09 11 02 08 06 10 01 03 04 -07)
}
part full-shapes full_shapes
# Colab's image's tests start here, beside the browser part, at a lower priority (nice): the browser part leaves about
# a third of CI's 2 cores idle (its kernels, JupyterLab and Chromium wait on one another), which they take up, without
# slowing the browser's kernels where both want a core. The hosted-colab part below waits for them.
hosted_wait_s=$SECONDS
wait "$hosted_build"
hosted_build_status=$?
hosted_wait_s=$((SECONDS - hosted_wait_s))
hosted_run=
if [ $hosted_build_status = 0 ]; then
  nice -n 10 "$PY" scripts/hosted_env.py colab --run-only > build/hosted-colab-run.log 2>&1 &
  hosted_run=$!
fi
# After nbval, so that the notebooks' runs come from the result cache it filled (the panels' runs use new
# settings, so they train for real); two notebooks at a time on CI's 2 cores. Screenshots: build/browser/.
# Without Chromium this part says how to get it and skips; .ci/run sets LABKIT_REQUIRE_BROWSER=1, where it fails.
browser() {
  if [ -n "${LABKIT_CHROMIUM_INSTALL_STATUS:-}" ]; then  # .ci/run is installing Chromium in the background
    local start=$SECONDS
    while [ ! -s "$LABKIT_CHROMIUM_INSTALL_STATUS" ] && [ $((SECONDS - start)) -lt 600 ]; do sleep 1; done
    echo "(Chromium installed in the background; waited $((SECONDS - start)) s for it; apt's exit status:" \
      "$(cat "$LABKIT_CHROMIUM_INSTALL_STATUS" 2>/dev/null || echo 'none after 600 s'))"
  fi
  "$PY" -m pytest tests/browser -q -p no:cacheprovider -n 2 -rs
}
part browser browser
# Colab's image: an older torch, its Python, ipywidgets 7.7.1, transformers 4, labkit installed as the setup cell
# installs it; the quick unit tests (the panel's among them, so ipywidgets 7's API) and three notebooks there. They
# ran beside the browser part (above); this part is the time left after it.
hosted_colab() {
  echo "(environment built in the background; waited $hosted_wait_s s for it before the browser part)"
  grep -v "^WARNING: Location" build/hosted-colab-build.log | tail -n 20
  [ $hosted_build_status = 0 ] || return $hosted_build_status
  local start=$SECONDS
  wait "$hosted_run"
  local status=$?
  echo "(its tests ran beside the browser part; waited $((SECONDS - start)) s more for them)"
  grep -v "^WARNING: Location" build/hosted-colab-run.log
  return $status
}
part hosted-colab hosted_colab

echo
echo "Part timings:"
printf '  %s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED parts: ${failed[*]}"
  exit 1
fi
echo "All parts passed."
