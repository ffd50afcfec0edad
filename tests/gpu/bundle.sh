#!/usr/bin/env bash
# The wheels a GPU machine without network lacks, in carry-sized folders (the device machine has no network).
#
#   tests/gpu/bundle.sh            # small bundle (tests/gpu, bench) + NeMo 2.5 `nemo.collections.llm`
#   tests/gpu/bundle.sh small      # the small bundle only
#   tests/gpu/bundle.sh refresh    # re-derive tests/gpu/bundle-nemo.txt from what NeMo really imports
#   tests/gpu/bundle.sh bridge     # Megatron-Bridge 0.6.2's pretrain: .gpu-bundle/bridge (below)
#
# The device image (tests/gpu/device-image-packages.txt) has Python 3.12, torch 2.11, lightning and
# pytorch-lightning 2.6.6, transformers, numpy, matplotlib...: those are never downloaded (pip runs
# with --no-deps on pinned lists, so no torch or nvidia-* CUDA wheel is ever pulled). What is:
#   small: this package (built from the working tree) and tests/gpu/bundle-small.txt
#   nemo:  tests/gpu/bundle-nemo.txt, the distributions NeMo 2.5's GPT pretraining imports
#          (tests/gpu/nemo2_pretrain.py --cpu-check), minus the image's; bitsandbytes is left out.
# Binary wheels for CPython 3.12 manylinux x86_64; an sdist-only package (antlr4-python3-runtime, wget)
# is built here with `pip wheel` and must come out pure Python (py3-none-any).
# Output, under $BUNDLE_DIR (default .gpu-bundle, git-ignored):
#   part1, part2, ...  the wheels, each folder at most $PART_MIB MiB (default 60: one device call carries
#                      at most 64 MiB with the working tree), the small bundle in part1;
#   site/site.tar.xz   (unless NO_ARCHIVE=1) the same wheels installed here for CPython 3.12 and packed
#                      with xz, less PuLP's CBC solver binaries (no LP is solved in pretraining): one
#                      carry, so one device call needs nothing staged by an earlier one.
#   bridge/            (`bundle.sh bridge` only; the other modes leave it alone) site.tar.xz: the wheels of
#                      tests/gpu/bundle-bridge.txt (Megatron-Bridge 0.6.2, megatron-core 0.19.2, their
#                      imports beyond the image, and the small bundle's wheels) installed for CPython 3.12,
#                      with Bridge's Transformer Engine import guarded (guard_te_import below), at most
#                      $BRIDGE_MIB MiB (default 50: it travels alone with the working tree); MANIFEST: its wheels.
# tests/gpu/run_on_device.sh takes either on the device machine (the Bridge site with --only bridge).
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
BUNDLE=${BUNDLE_DIR:-.gpu-bundle}
PART_MIB=${PART_MIB:-60}
PY=${PYTHON:-python3}                    # any Python with pip >= 22 and network
NEMO_PY=${NEMO_PYTHON:-.venv-nemo/bin/python}
HERE=tests/gpu

platforms=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done  # the image: glibc 2.39
binary=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        "${platforms[@]}")
pip=("$PY" -m pip --disable-pip-version-check)
install=("${pip[@]}" install --quiet --no-deps --no-index --no-compile --python-version 3.12 --implementation cp
         --abi cp312 "${platforms[@]}" --only-binary=:all:)

wheel_project() {  # the normalized project name of a wheel file
    basename "$1" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'
}

compat_projects() {  # the projects of bundle-nemo-compat.txt, normalized
    requirements "$HERE/bundle-nemo-compat.txt" | sed 's/[=<>!~].*//' | tr 'A-Z_.' 'a-z--'
}

requirements() {  # the pinned lines of a requirements file
    grep -vE '^\s*(#|$)' "$1" | sed 's/\s*#.*//'
}

fetch() {  # fetch REQUIREMENT DIR: a cp312 manylinux or pure wheel; else build one from the sdist
    local req=$1 dir=$2 log
    log=$(mktemp)
    if "${pip[@]}" download --quiet "${binary[@]}" -d "$dir" "$req" >"$log" 2>&1; then
        rm -f "$log"; return
    fi
    echo "  $req: no wheel for cp312 manylinux; building it from the sdist" >&2
    local build; build=$(mktemp -d)
    if ! "${pip[@]}" wheel --quiet --no-deps --no-binary :all: -w "$build" "$req" >>"$log" 2>&1; then
        cat "$log" >&2; echo "bundle.sh: could not get $req (see above)" >&2; exit 1
    fi
    for wheel in "$build"/*.whl; do
        case "$wheel" in
            *-py3-none-any.whl|*-py2.py3-none-any.whl) mv "$wheel" "$dir"/ ;;
            *) echo "bundle.sh: $req built as $(basename "$wheel"), not pure Python: it would not run on" \
                    "the device's CPython 3.12; pin a version that has a cp312 wheel" >&2; exit 1 ;;
        esac
    done
    rm -rf "$build" "$log"
}

refresh_nemo_list() {
    [ -x "$NEMO_PY" ] || { echo "bundle.sh refresh: needs $NEMO_PY (.ci/setup-nemo makes it)" >&2; exit 1; }
    local work; work=$(mktemp -d)
    (cd "$work" && "$OLDPWD/$NEMO_PY" "$OLDPWD/$HERE/nemo2_pretrain.py" --cpu-check \
        --steps 4 --out "$work/out" --list-distributions "$work/imported.txt" >"$work/log" 2>&1) \
        || { tail -30 "$work/log" >&2; echo "bundle.sh refresh: the CPU check failed (log above)" >&2; exit 1; }
    "$PY" - "$work/imported.txt" "$HERE/device-image-packages.txt" "$HERE/bundle-small.txt" \
        "$HERE/bundle-nemo-compat.txt" >"$HERE/bundle-nemo.txt" <<'EOF'
import re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
lines = lambda path: [l.split("#")[0].strip() for l in open(path) if l.split("#")[0].strip()]
imported, image, small, compat = (lines(p) for p in sys.argv[1:])
skip = {norm(n) for n in image} | {norm(l.split("==")[0]) for l in small + compat}
skip |= {"nemo-throughput", "bitsandbytes", "torch", "triton", "pip", "setuptools", "wheel"}
# nvidia-modelopt: NeMo 2.5 pins 0.35.0, whose import of torch.onnx._globals fails on new torch (.ci/setup-nemo)
print("# NeMo 2.5 GPT pretraining on one GPU: the distributions tests/gpu/nemo2_pretrain.py --cpu-check\n"
      "# imports in .venv-nemo, minus the device image's (device-image-packages.txt), the small bundle's\n"
      "# and bundle-nemo-compat.txt's (the versions of image packages that NeMo 2.5 needs instead).\n"
      "# Written by `tests/gpu/bundle.sh refresh`; bitsandbytes (67 MB, not needed for pretraining) left out.")
for line in imported:
    name = line.split("==")[0]
    if norm(name) not in skip and not norm(name).startswith("nvidia-") or norm(name) == "nvidia-modelopt":
        print(line)
EOF
    rm -rf "$work"
    echo "wrote $HERE/bundle-nemo.txt ($(requirements "$HERE/bundle-nemo.txt" | wc -l) distributions)"
}

guard_te_import() {  # guard_te_import FILE: megatron/bridge/peft/lora_layers.py, patched in place
    # Megatron-Bridge 0.6.2 imports Transformer Engine unconditionally in its LoRA layers, which the
    # pretraining path imports (megatron.bridge.peft); the GPU image has no Transformer Engine and the
    # LoRA layers are never used in pretraining. So the import falls back to a placeholder whose
    # attributes are empty classes (the module's class statements subclass te.*). Idempotent; fails
    # loudly if the line is not there exactly once (another Bridge version: look at the file again).
    "$PY" - "$1" <<'EOF'
import pathlib, sys
path = pathlib.Path(sys.argv[1])
line = "import transformer_engine.pytorch as te\n"
guard = '''try:
    import transformer_engine.pytorch as te
except ImportError:  # bridge-bundle patch: no Transformer Engine on the device; LoRA-TE paths unused

    class _NoTE:
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return self if name == "ops" else type("NoTE_" + name, (), {})

    te = _NoTE()
'''
text = path.read_text()
if guard in text:
    print(f"  {path.name}: Transformer Engine import already guarded")
    sys.exit(0)
lines = text.splitlines(keepends=True)
hits = [i for i, l in enumerate(lines) if l == line]
if len(hits) != 1:
    sys.exit(f"bundle.sh: {path}: expected the line {line.strip()!r} exactly once, found it {len(hits)} times;"
             " the TE guard does not fit this Megatron-Bridge version")
lines[hits[0]] = guard
path.write_text("".join(lines))
print(f"  {path.name}: Transformer Engine import guarded (line {hits[0] + 1})")
EOF
}

make_bridge() {  # $BUNDLE/bridge: site.tar.xz and MANIFEST, one carry for run_on_device.sh --only bridge
    local out=$BUNDLE/bridge list=$HERE/bundle-bridge.txt size limit=$((${BRIDGE_MIB:-50} * 1024 * 1024))
    rm -rf "$out"
    wheels=$(mktemp -d) root=$(mktemp -d)
    trap 'rm -rf "$wheels" "$root"' EXIT
    echo "Megatron-Bridge bundle: $list ($(requirements "$list" | wc -l) distributions)"
    for req in $(requirements "$list"); do fetch "$req" "$wheels"; done
    if [ "$(ls "$wheels"/*.whl | wc -l)" -ne "$(requirements "$list" | wc -l)" ]; then
        echo "bundle.sh bridge: $(ls "$wheels"/*.whl | wc -l) wheels for $(requirements "$list" | wc -l) lines of $list" >&2
        exit 1
    fi
    echo "  installing them for CPython 3.12 manylinux into a site"
    # pip install checks Requires-Python against the Python running it, not --python-version: Bridge
    # says >=3.12, and $PY may be older; the wheels were chosen for 3.12 above
    "${install[@]}" --ignore-requires-python --target "$root" "$wheels"/*.whl
    guard_te_import "$root/megatron/bridge/peft/lora_layers.py"
    # no bytecode of this machine's Python (--no-compile writes none; to be sure) and no console scripts
    # naming its interpreter
    find "$root" -name __pycache__ -type d -prune -exec rm -rf {} +
    rm -rf "$root/bin"
    mkdir -p "$out"
    (cd "$wheels" && ls *.whl | sort) >"$out/MANIFEST"
    echo "  packing $out/site.tar.xz with xz (a minute or two)"
    tar -C "$root" -cf - . | xz -9 -T0 >"$out/site.tar.xz"
    size=$(stat -c %s "$out/site.tar.xz")
    echo "  $out/site.tar.xz: $(awk "BEGIN { printf \"%.1f\", $size / 1048576 }") MiB, $(wc -l <"$out/MANIFEST") wheels"
    if [ "$size" -gt "$limit" ]; then
        echo "bundle.sh bridge: the site archive is over ${BRIDGE_MIB:-50} MiB: with the working tree it would" \
             "not fit one device call's carry (64 MiB)" >&2
        rm -rf "$out"; exit 1
    fi
    echo
    echo "On the device machine (README, \"Megatron-Bridge's pretrain loop\"), one call of its own:"
    echo "  carry [\"$out\"]: tests/gpu/run_on_device.sh --only bridge $out"
}

if [ "$what" = refresh ]; then refresh_nemo_list; exit 0; fi
if [ "$what" = bridge ]; then make_bridge; exit 0; fi
case "$what" in all|small) ;; *) echo "usage: $0 [all|small|refresh|bridge]" >&2; exit 2 ;; esac

rm -rf "$BUNDLE"/part* "$BUNDLE"/site "$BUNDLE"/MANIFEST "$BUNDLE"/small "$BUNDLE"/nemo "$BUNDLE"/compat  # not bridge/
mkdir -p "$BUNDLE/small" "$BUNDLE/nemo" "$BUNDLE/compat"
echo "small bundle: nemo-throughput (this working tree) and $HERE/bundle-small.txt"
"${pip[@]}" wheel --quiet --no-deps -w "$BUNDLE/small" .
for req in $(requirements "$HERE/bundle-small.txt"); do fetch "$req" "$BUNDLE/small"; done
if [ "$what" = all ]; then
    echo "NeMo bundle: $HERE/bundle-nemo.txt ($(requirements "$HERE/bundle-nemo.txt" | wc -l) distributions)"
    for req in $(requirements "$HERE/bundle-nemo.txt"); do fetch "$req" "$BUNDLE/nemo"; done
    echo "NeMo's own versions of image packages: $HERE/bundle-nemo-compat.txt"
    for req in $(requirements "$HERE/bundle-nemo-compat.txt"); do fetch "$req" "$BUNDLE/compat"; done
fi

"$PY" - "$BUNDLE" "$PART_MIB" <<'EOF'
"""Split into parts of at most PART_MIB MiB: the small bundle first in part1, then the NeMo wheels,
largest first, each into the first part with room (first-fit decreasing)."""
import pathlib, re, shutil, sys
bundle, limit = pathlib.Path(sys.argv[1]), int(sys.argv[2]) * 2**20
small, nemo = (sorted((bundle / kind).glob("*.whl")) for kind in ("small", "nemo"))
nemo += sorted((bundle / "compat").glob("*.whl"))
projects = {}
for wheel in small + nemo:
    project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    if project in projects:
        sys.exit(f"bundle.sh: two wheels of {project}: {projects[project].name} and {wheel.name}; keep one")
    projects[project] = wheel
    if wheel.stat().st_size > limit:
        sys.exit(f"bundle.sh: {wheel.name} alone is over {limit >> 20} MiB")
parts = [list(small)]
for wheel in sorted(nemo, key=lambda w: -w.stat().st_size):
    size = lambda part: sum(w.stat().st_size for w in part)
    for part in parts:
        if size(part) + wheel.stat().st_size <= limit:
            part.append(wheel)
            break
    else:
        parts.append([wheel])
for index, part in enumerate(parts, 1):
    folder = bundle / f"part{index}"
    folder.mkdir()
    for wheel in part:
        shutil.move(str(wheel), folder / wheel.name)
    print(f"  {folder}: {len(part)} wheels, {sum(w.stat().st_size for w in folder.iterdir()) / 2**20:.1f} MiB"
          + (" (small bundle included)" if index == 1 and small else ""))
for kind in ("small", "nemo", "compat"):
    shutil.rmtree(bundle / kind)
total = sum(w.stat().st_size for w in bundle.glob("part*/*.whl"))
print(f"  total: {len(small) + len(nemo)} wheels, {total / 2**20:.1f} MiB ({len(small)} in the small bundle)")
EOF

# The parts' list, so that the device side can tell whether every part reached it.
(cd "$BUNDLE" && ls part*/*.whl | sed 's|.*/||' | sort) >"$BUNDLE/MANIFEST"
for part in "$BUNDLE"/part*; do cp "$BUNDLE/MANIFEST" "$part/MANIFEST"; done
parts=$(cd "$BUNDLE" && ls -d part* | sort -V)
limit=$((PART_MIB * 1024 * 1024))

if [ "$what" = all ] && [ -z "${NO_ARCHIVE:-}" ]; then
    echo "site archive: the wheels installed for CPython 3.12 manylinux, packed with xz (a few minutes)"
    root=$(mktemp -d)
    compat=$(compat_projects)
    wheels=() compat_wheels=()
    for wheel in "$BUNDLE"/part*/*.whl; do
        if echo "$compat" | grep -qx "$(wheel_project "$wheel")"; then compat_wheels+=("$wheel"); else wheels+=("$wheel"); fi
    done
    "${install[@]}" --target "$root/gpu-site" "${wheels[@]}"
    [ ${#compat_wheels[@]} -eq 0 ] || "${install[@]}" --target "$root/gpu-nemo-compat" "${compat_wheels[@]}"
    # CBC for every OS (no LP is solved in pretraining); console scripts naming this machine's python
    rm -rf "$root"/gpu-site/pulp/solverdir/cbc "$root"/gpu-site/bin "$root"/gpu-nemo-compat/bin
    mkdir -p "$BUNDLE/site"
    cp "$BUNDLE/MANIFEST" "$BUNDLE/site/MANIFEST"
    tar -C "$root" -cf - . | xz -9 -T0 >"$BUNDLE/site/site.tar.xz"
    rm -rf "$root"
    size=$(stat -c %s "$BUNDLE/site/site.tar.xz")
    echo "  $BUNDLE/site/site.tar.xz: $((size / 1024 / 1024)) MiB"
    if [ "$size" -gt "$limit" ]; then
        echo "bundle.sh: the site archive is over $PART_MIB MiB: carry the parts instead" >&2
        rm -rf "$BUNDLE/site"
    fi
fi

last=$(echo "$parts" | tail -1)
echo
echo "On the device machine (README, \"GPU proof\"): each call names one folder in carry and runs"
echo "tests/gpu/run_on_device.sh with that folder; the runner writes everything to \$OUT."
if [ -f "$BUNDLE/site/site.tar.xz" ]; then
    echo "Everything in one carry (each call is self-contained):"
    echo "  carry [\"$BUNDLE/site\"]: tests/gpu/run_on_device.sh --only tests,bench $BUNDLE/site"
    echo "  carry [\"$BUNDLE/site\"]: tests/gpu/run_on_device.sh --only nemo,bench-large $BUNDLE/site"
fi
echo "Or the wheel parts, one call per part right after the other (the machine keeps /tmp 30 s after a call):"
for part in $parts; do
    if [ "$part" = "$last" ]; then
        echo "  carry [\"$BUNDLE/$part\"]: tests/gpu/run_on_device.sh $BUNDLE/$part"
        echo "      (installs every staged wheel with pip install --no-index --no-deps --target /tmp/gpu-site,"
        echo "       then runs the steps; split them over calls with --only if they exceed 10 minutes)"
    else
        echo "  carry [\"$BUNDLE/$part\"]: tests/gpu/run_on_device.sh --stage-only $BUNDLE/$part"
    fi
done
echo "Only tests/gpu and the bench need only part1 (the small bundle):"
echo "  carry [\"$BUNDLE/part1\"]: tests/gpu/run_on_device.sh --only tests,bench $BUNDLE/part1"
