#!/usr/bin/env bash
# The wheels the GPU suite (benchmarks/gpu_suite.sh) needs on a lent GPU without network, downloaded HERE into .whl/
# (git-ignored: never commit them). gpu_suite.sh installs whatever .whl/ holds into a temporary --target there.
#
#     bash benchmarks/gpu_wheels.sh        # idempotent: a wheel already in .whl/ is kept, another version removed
#
# For the lent machine (Python 3.12, torch 2.11 + CUDA 13.0, manylinux x86-64), only what its image lacks:
# - bitsandbytes (8-bit optimizers, NF4/QLoRA: notebooks 03, 06, 08), slimmed to the CPU library and the CUDA 13
#   ones (BNB_LIBS): its other builds (CUDA 11.8-12.8, ROCm, XPU) are 40 MB that no CUDA 13 torch loads;
# - torchao (06's int8/int4), the release for that torch: labkit.project.torchao_requirement(DEVICE_TORCH);
# - ipywidgets 8 (labkit's declared dependency) and what the image lacks of its dependencies: IPython and its own.
# Everything that travels to the machine (the working tree and .whl/) must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
DEVICE_TORCH="${DEVICE_TORCH:-2.11.0}"
BNB_LIBS="${BNB_LIBS:-cpu cuda130 cuda132}"  # "all" keeps every library bitsandbytes ships
DIR=.whl

# labkit/project.py alone (stdlib only): no torch needed here
TORCHAO="$("$PY" -c "import importlib.util as u; s = u.spec_from_file_location('project', 'src/labkit/project.py')
m = u.module_from_spec(s); s.loader.exec_module(m); print(m.torchao_requirement('$DEVICE_TORCH'))")"
# Requires-Dist read from each wheel's METADATA; pygments, psutil, typing_extensions, numpy, packaging and torch are
# on the machine already (device/KINDS.md, "Python packages already there").
WHEELS=(
    bitsandbytes==0.50.2 "$TORCHAO"
    ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17 comm==0.2.3 traitlets==5.16.1
    ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 parso==0.8.7 matplotlib_inline==0.2.2
    pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 stack_data==0.6.3 executing==2.3.0
    asttokens==3.0.2 pure_eval==0.2.4
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

mkdir -p "$DIR"
for spec in "${WHEELS[@]}"; do
    name="${spec%%==*}" version="${spec#*==}"
    for old in "$DIR/$name"-*.whl; do  # one version of each: two would stop the whole install there
        if [ -e "$old" ] && [[ "$old" != "$DIR/$name-$version-"* ]]; then
            rm -v "$old"
        fi
    done
    if compgen -G "$DIR/$name-$version-*.whl" >/dev/null; then
        continue
    fi
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]/#/--platform=}" -d "$DIR" "$spec"
done

# bitsandbytes: keep only BNB_LIBS' native libraries (pip installs a wheel whose RECORD lists what it holds)
[ "$BNB_LIBS" = all ] || "$PY" - "$DIR" $BNB_LIBS <<'PY'
import glob, os, re, sys, zipfile
folder, keep = sys.argv[1], set(sys.argv[2:])
for path in glob.glob(os.path.join(folder, "bitsandbytes-*.whl")):
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        drop = {n for n in names if (m := re.fullmatch(r"bitsandbytes/libbitsandbytes_(\w+)\.(so|dll|dylib)", n))
                and m.group(1) not in keep}
        if not drop:
            continue
        slim = path + ".slim"
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
            for info in wheel.infolist():
                if info.filename in drop:
                    continue
                data = wheel.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    data = b"".join(line for line in data.splitlines(keepends=True)
                                    if line.split(b",")[0].decode() not in drop)
                out.writestr(info, data)
    os.replace(slim, path)
    print(f"gpu_wheels.sh: {os.path.basename(path)} slimmed to {sorted(keep)}: {len(drop)} libraries dropped")
PY

ls -l "$DIR"/*.whl | awk '{print $5, $9}'
total=$(du -cb "$DIR"/*.whl | tail -1 | cut -f1)
echo "gpu_wheels.sh: $(ls "$DIR"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $DIR" \
     "(they travel with the working tree: together under 64 MiB)"
