#!/usr/bin/env bash
# The accelerator figures the open issues ask for, in one command that fits one device lease
# (a machine start plus at most 10 minutes a command, 15 in all): a lease is short, and a figure
# compared across machine starts swings by up to 50 %, so everything is measured in one start.
#
#   bash bench/device_round.sh LARGE_MODEL_DIR SMALL_MODEL_DIR [OUT_DIR]
#
# Steps (STEPS, comma-separated, default large,small,calibrate; each bounded by `timeout`, so
# that one that hangs leaves the others' figures):
#   large      the large encoder (bge-large's shape): the engine's in-process ceiling at batch
#              32/128/512, served 200s/s and p99, the overload levels, and the accelerator pool's
#              rate with the CPU pool idle, full and saturated (bench/served.py, ~220 s on an H200);
#   small      the small encoder (MiniLM's shape): ceiling and served rate (~90 s);
#   calibrate  `windve calibrate` of the accelerator pool over HTTP against a stress test on the
#              same path, at a 0.25 s SLO (~170 s);
#   compile    not in the default round: torch.compile (default and reduce-overhead, CUDA
#              graphs) against eager for both encoders at batch 8/32/128/512 (bench/compile.py);
#              run it alone (STEPS=compile) in a second command.
# Environment, defaults are the GPU run's: PYTHON (python3), CLIENTS (1024,4096), FACTORS
# (1,1.5,2,10), LEVEL_SECONDS (8), CAL_SLO (0.25), CAL_STEP (16), POOLS (accelerator), DEVICE
# (cuda:0, for compile) and ROUND_SECONDS (520): the whole round's bound. The default steps' own
# bounds add up to 690 s; each is
# cut to what is left of the round, and a step with under 30 s left is skipped, so that the
# round (with the device's set-up before it) ends inside one 600 s command and returns its logs.
# Logs and JSON go to OUT_DIR (default: $OUT, else ./device-round).
set -u
large=${1:?usage: device_round.sh LARGE_MODEL_DIR SMALL_MODEL_DIR [OUT_DIR]}
small=${2:?usage: device_round.sh LARGE_MODEL_DIR SMALL_MODEL_DIR [OUT_DIR]}
out=${3:-${OUT:-device-round}}
python=${PYTHON:-python3}
steps=,${STEPS:-large,small,calibrate},
clients=${CLIENTS:-1024,4096}
seconds=${LEVEL_SECONDS:-8}
deadline=$((SECONDS + ${ROUND_SECONDS:-520}))
mkdir -p "$out"
export HF_HUB_OFFLINE=1

step() {  # step NAME SECONDS COMMAND...: run it bounded, log it, say how it ended
    local name=$1 limit=$2 left=$((deadline - SECONDS))
    shift 2
    if ((left < 30)); then
        echo "== $name: skipped, $left s left of ROUND_SECONDS"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name ($(date -u +%T), at most $limit s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - start)) s; log $out/$name.log"
    tail -n 40 "$out/$name.log"
}

{
    "$python" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
EOF
    git rev-parse --short HEAD 2>/dev/null
    "$python" -m windve.cli detect 2>&1 | tail -n 20

    [[ $steps == *,large,* ]] && step large 300 "$python" bench/served.py --model "$large" \
        --sections engine,served,overload,isolation --clients "$clients" \
        --overload-factors "${FACTORS:-1,1.5,2,10}" --seconds "$seconds" \
        --warmup-seconds 2 --json-out "$out/large.json"
    [[ $steps == *,small,* ]] && step small 150 "$python" bench/served.py --model "$small" \
        --sections engine,served --clients "$clients" --seconds "$seconds" --warmup-seconds 2 \
        --json-out "$out/small.json"
    [[ $steps == *,calibrate,* ]] && step calibrate 240 env WINDVE_MODEL="$large" "$python" -m windve.cli \
        calibrate --pools "${POOLS:-accelerator}" --slo "${CAL_SLO:-0.25}" --stress-test \
        --step "${CAL_STEP:-16}" --out "$out/calibration.json"
    if [[ $steps == *,compile,* ]]; then
        for model in "$large" "$small"; do
            step "compile-$(basename "$model")" 240 "$python" bench/compile.py --model "$model" \
                --device "${DEVICE:-cuda:0}" --modes default,reduce-overhead --batches 8,32,128,512
        done
    fi
    true
} 2>&1 | tee "$out/round.log"
