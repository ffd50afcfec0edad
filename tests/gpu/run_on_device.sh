#!/usr/bin/env bash
# On a GPU machine without network: install the carried bundle, then run the GPU proof (tests/gpu/README.md),
# everything into $OUT. Each step's failure is recorded and the later steps still run.
#
#   tests/gpu/run_on_device.sh [--stage-only] [--only STEPS] BUNDLE_FOLDER...
#
# BUNDLE_FOLDER: what tests/gpu/bundle.sh made and the call carried: .gpu-bundle/site (site.tar.xz,
# everything in one) or .gpu-bundle/partN (wheels). Wheel parts are staged in /tmp/gpu-bundle and
# installed together, once every part of the MANIFEST is there (`--stage-only`: stage, run nothing).
# .gpu-bundle/bridge (`bundle.sh bridge`: a site.tar.xz whose MANIFEST lists megatron-bridge) is unpacked
# into /tmp/bridge-site, for the bridge step only.
# STEPS, comma-separated (default all; one call may run 10 minutes, so split them over two calls):
#   tests        python -m pytest tests/gpu (timing vs truth, syncs, NCCL, peaks/MFU, compile/graphs,
#                profiler trace of the hooks)                                   at most 120 s (69 s on an H200)
#   bench        nemo-throughput bench --device cuda, GPT-3 126M, no callback against ours, 14 rounds
#                (a 95 % interval of about +-0.3 % on the overhead)            at most 200 s (about 170 s)
#   diagnose     the bench's diagnostic conditions, 2 rounds: our hooks against an empty callback's
#                (the floor), with the GPU idle before each (idle-gpu) and with a 5 ms NVML energy
#                read (slow-nvml)                                              at most 75 s
#   nemo         NeMo 2 llm.pretrain GPT-3 126M, ours beside NeMo's timing and FLOPs callbacks, with a
#                torch.profiler window over our hooks in steps 19-22            at most 180 s (103 s on an H200)
#   bench-large  the bench on GPT-3 2.7B (the largest for one 80 GB GPU), 3 rounds, no sync count
#                                                                               at most 300 s (estimate 4 min)
#   bridge       Megatron-Bridge 0.6.2's `pretrain` (tests/gpu/bridge_pretrain.py under torchrun, one GPU,
#                a 4-layer GPT, 30 steps) with our callback, from the Bridge site   at most 180 s
#                Not in the default: one carry (64 MiB with the working tree) cannot hold the NeMo site
#                and the Bridge site together, so it takes a call of its own carrying .gpu-bundle/bridge:
#                  tests/gpu/run_on_device.sh --only bridge .gpu-bundle/bridge
# So the default, `--only tests,bench,diagnose,nemo` (the proof, with the site archive), fits one call of at
# most 9 minutes; `--only bench-large` and `--only bridge` take a call each. Each step's results reach $OUT
# as it ends, so a call stopped at its limit still brings back what was done.
# $OUT gets at most 8 files (the device tool's limit): run.txt (each step's status), the JSON results
# (gpu_results.json, bench_<size>.json, nemo2_compare.json, bridge_pretrain.json) and logs.tar.gz (every
# log, the junit XML, the profiler traces, our summaries).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-/tmp/gpu-out}  # the device tool sets $OUT
WORK=/tmp/gpu-run
STAGE=/tmp/gpu-bundle
SITE=/tmp/gpu-site                # every wheel but NeMo's versions of image packages
SITE_NEMO=/tmp/gpu-nemo-compat    # those (tests/gpu/bundle-nemo-compat.txt): on the NeMo step's path only
SITE_BRIDGE=/tmp/bridge-site      # Megatron-Bridge's (tests/gpu/bundle-bridge.txt): on the bridge step's path only
PY=${PYTHON:-python3}
steps=tests,bench,diagnose,nemo
stage_only=
folders=()
while [ $# -gt 0 ]; do
    case "$1" in
        --only) steps=$2; shift 2 ;;
        --stage-only) stage_only=1; shift ;;
        -h|--help) sed -n '2,/^set /{/^set /!p}' "$0"; exit 0 ;;
        *) folders+=("$1"); shift ;;
    esac
done
mkdir -p "$OUT" "$WORK/logs" "$STAGE"
status=$OUT/run.txt
note() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$status"; }

# ---------------------------------------------------------------------------------------- install
for folder in "${folders[@]}"; do
    if [ -f "$folder/site.tar.xz" ] && grep -q '^megatron_bridge-' "$folder/MANIFEST" 2>/dev/null; then
        rm -rf "$SITE_BRIDGE" && mkdir -p "$SITE_BRIDGE" && tar -C "$SITE_BRIDGE" -xJf "$folder/site.tar.xz" \
            && note "installed $folder/site.tar.xz (Megatron-Bridge) into $SITE_BRIDGE" \
            || note "FAILED to unpack $folder/site.tar.xz into $SITE_BRIDGE"
    elif [ -f "$folder/site.tar.xz" ]; then
        rm -rf "$SITE" "$SITE_NEMO" && tar -C /tmp -xJf "$folder/site.tar.xz" \
            && note "installed $folder/site.tar.xz into $SITE and $SITE_NEMO" || note "FAILED to unpack $folder/site.tar.xz"
        cp "$folder/MANIFEST" "$STAGE/MANIFEST.site" 2>/dev/null
    else
        cp "$folder"/*.whl "$STAGE"/ 2>/dev/null && cp "$folder/MANIFEST" "$STAGE/MANIFEST" \
            && note "staged $(ls "$folder"/*.whl | wc -l) wheels of $folder" || note "FAILED: no wheels in $folder"
    fi
done
if [ -n "$stage_only" ]; then
    note "staged so far: $(ls "$STAGE"/*.whl 2>/dev/null | wc -l) wheels; next call: the remaining part(s)"
    exit 0
fi
nemo_complete=
if [ -f "$STAGE/MANIFEST.site" ]; then
    nemo_complete=1
elif ls "$STAGE"/*.whl >/dev/null 2>&1; then
    missing=$(cd "$STAGE" && while read -r wheel; do [ -f "$wheel" ] || echo "$wheel"; done <MANIFEST)
    rm -rf "$SITE" "$SITE_NEMO"
    compat=$(grep -vE '^\s*(#|$)' tests/gpu/bundle-nemo-compat.txt | sed 's/[=<>!~ #].*//' | tr 'A-Z_.' 'a-z--')
    wheels=() compat_wheels=()
    for wheel in "$STAGE"/*.whl; do
        project=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
        if echo "$compat" | grep -qx "$project"; then compat_wheels+=("$wheel"); else wheels+=("$wheel"); fi
    done
    install=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir)
    if "${install[@]}" --target "$SITE" "${wheels[@]}" >"$WORK/logs/pip_install.log" 2>&1 && { [ ${#compat_wheels[@]} -eq 0 ] \
            || "${install[@]}" --target "$SITE_NEMO" "${compat_wheels[@]}" >>"$WORK/logs/pip_install.log" 2>&1; }; then
        note "installed ${#wheels[@]} staged wheels into $SITE, ${#compat_wheels[@]} into $SITE_NEMO"
    else
        note "FAILED: pip install of the staged wheels (logs/pip_install.log)"
    fi
    if [ -z "$missing" ]; then nemo_complete=1; else
        note "not staged (the machine went cold between calls, or a part was not carried yet):" \
             "$(echo "$missing" | wc -l) wheels, e.g. $(echo "$missing" | head -3 | tr '\n' ' ')"
    fi
elif [ ! -d "$SITE_BRIDGE/megatron/bridge" ]; then
    note "no bundle carried: the image's packages only (hydra-core/omegaconf are missing there)"
fi
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}  # the working tree's package before the wheel's
export PYTHONUNBUFFERED=1 NEMO_THROUGHPUT_GPU_RESULTS=$WORK/tests

{
    date -u; nvidia-smi 2>&1 | head -15
    "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda,
               torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU')"
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|lightning|pytorch-lightning|transformers|numpy) '
} >"$WORK/logs/environment.txt" 2>&1
note "$(grep -m1 '^torch' "$WORK/logs/environment.txt")"

run_step() {  # run_step NAME SECONDS COMMAND...: log to logs/NAME.log, record the outcome, never stop
    local name=$1 seconds=$2; shift 2
    case ",$steps," in *",$name,"*) ;; *) return ;; esac
    note "start $name"
    local start=$SECONDS
    timeout --kill-after=20 "$seconds" "$@" >"$WORK/logs/$name.log" 2>&1
    local rc=$?
    local what="rc=$rc"; [ $rc -eq 124 ] && what="TIMED OUT after ${seconds}s"
    note "end   $name: $what in $((SECONDS - start)) s$( [ $rc -ne 0 ] && echo "; tail of logs/$name.log:")"
    [ $rc -ne 0 ] && tail -15 "$WORK/logs/$name.log" | sed 's/^/    /' | tee -a "$status"
    save_results
    return 0
}

save_results() {  # what the steps so far produced, into $OUT (at most 8 files: the device tool's limit)
    for file in "$WORK/tests/gpu_results.json" "$WORK"/bench_*.json "$WORK/nemo2/nemo2_compare.json" \
                "$WORK/bridge/bridge_pretrain.json"; do
        [ -f "$file" ] && cp "$file" "$OUT/"
    done
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" --exclude='nemo_logs' logs tests nemo2 bridge 2>/dev/null
    if [ "$(stat -c %s "$OUT/logs.tar.gz")" -gt $((15 * 1024 * 1024)) ]; then  # over 16 MiB does not come back
        tar -C "$WORK" -czf "$OUT/logs.tar.gz" --exclude='nemo_logs' --exclude='*trace*' logs tests nemo2 bridge \
            2>/dev/null
        note "logs.tar.gz without the profiler traces (over 15 MiB with them)"
    fi
}

run_step tests 120 "$PY" -m pytest -v -rA -p no:cacheprovider tests/gpu --junitxml "$WORK/logs/tests_gpu.xml"
run_step bench 200 "$PY" -m nemo_throughput.cli bench --device cuda --size gpt3-126m --steps 60 --rounds 14 \
    --conditions no-callback,nemo-throughput --format json --output "$WORK/bench_gpt3-126m.json"
run_step diagnose 75 "$PY" -m nemo_throughput.cli bench --device cuda --size gpt3-126m --steps 60 --rounds 2 \
    --conditions empty-callback,nemo-throughput,nemo-throughput-idle-gpu,nemo-throughput-slow-nvml --no-sync-count \
    --format json --output "$WORK/bench_diagnose.json"
if case ",$steps," in *,nemo,*) true ;; *) false ;; esac && [ -z "$nemo_complete" ]; then
    note "skip  nemo: the NeMo wheels are not all here (see above)"
else
    run_step nemo 150 env PYTHONPATH="$REPO:$SITE_NEMO:$SITE" "$PY" tests/gpu/nemo2_pretrain.py --out "$WORK/nemo2" \
        --trace-steps 19:22
fi
run_step bench-large 300 "$PY" -m nemo_throughput.cli bench --device cuda --size gpt3-2.7b --steps 30 \
    --window 11: --rounds 3 --conditions no-callback,nemo-throughput,lightning-throughput-monitor --no-sync-count \
    --format json --output "$WORK/bench_gpt3-2.7b.json"
if case ",$steps," in *,bridge,*) true ;; *) false ;; esac && [ ! -d "$SITE_BRIDGE/megatron/bridge" ]; then
    note "skip  bridge: no Megatron-Bridge site (carry .gpu-bundle/bridge, made by tests/gpu/bundle.sh bridge)"
else
    # torchrun (as torch.distributed.run of this Python), one process; the Bridge site before the small
    # bundle's, which it includes anyway (one carry suffices)
    run_step bridge 180 env PYTHONPATH="$REPO:$SITE_BRIDGE:$SITE" "$PY" -m torch.distributed.run \
        --nproc_per_node=1 tests/gpu/bridge_pretrain.py --out "$WORK/bridge"
fi

# ---------------------------------------------------------------------------------------- results
note "results in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
tail -40 "$WORK"/logs/tests.log 2>/dev/null | grep -E "passed|failed|error|PASSED|FAILED|ERROR" | tail -20
for size in gpt3-126m diagnose gpt3-2.7b; do
    [ -f "$WORK/bench_$size.json" ] && "$PY" -c "import json, sys; from nemo_throughput.bench.render import render
print(render(json.load(open(sys.argv[1]))), end='')" "$WORK/bench_$size.json"
done
[ -f "$WORK/nemo2/nemo2_compare.json" ] && tail -30 "$WORK/logs/nemo.log"
[ -f "$WORK/bridge/bridge_pretrain.json" ] && "$PY" -c "import json, sys; r = json.load(open(sys.argv[1]))
print('bridge_pretrain:', 'ok' if r['ok'] else 'FAILED', r['checks'])" "$WORK/bridge/bridge_pretrain.json"
exit 0
