#!/usr/bin/env bash
# The checks that need a GPU, as one run of at most BUDGET seconds (420, 7 minutes) of wall time on a
# bare CUDA machine with PyTorch (the device machine a session is sometimes lent). A global deadline
# bounds every step: each runs under `timeout` for the smaller of its own budget and the time left
# before the deadline, less what the end needs (FINISH_S: the report, the archive and `ray stop`); a
# step with no time left is skipped and said so. The end runs on every exit (a trap on EXIT, INT and
# TERM), so Ray is stopped and the archive written even when a step fails or the script is stopped.
# Give the device tool a timeout_s above BUDGET (450 for 420): a kill from outside (SIGKILL) runs no
# trap, and Ray's daemons left running would hold the GPU.
#
# The steps, in order, with their budgets in seconds (STEPS below; their sum is at most 420, which
# tests/test_bench.py checks):
#
#   setup        nvidia-smi, versions, Ray unpacked and compiled when it was brought (`.gpu-ray`, below);
#   pytest       the CUDA cases (-k "cuda or gpu") of the Ray-free tests of the learner's device path:
#                micro-batch streaming on the side stream against the whole batch, evaluate in bf16
#                against fp32, two learners at half a GPU under a fixed cap, the GRU at float32 under
#                bf16, channels-last encoders, the flat storage on the device (their CPU cases run in CI);
#   learner      one bare learner's step (bench/learner_device.py, ucf101-rgb, bf16): the rate the job is
#                measured against;
#   memory_cap   the streaming check under a CUDA memory cap (B = 576 blocks, streamed against staged whole);
#   dataloader   the plain PyTorch loop a user would otherwise write (bench/dataloader_loop.py: per-video
#                padding, CPU augmentation in 8 one-thread DataLoader workers) over the same synthetic videos;
#   job_demo     the Ray job (jobs/ucf101.py, a local Ray of this node), demo preset, 2 learners sharing
#                the GPU (--gpus-per-learner 0.5);
#   job_ucf101   the ucf101-rgb model on the synthetic set in bf16, the same 2 learners, UCF_EPOCHS epochs
#                (epoch 0 computes every video's partial augmentation on the CPUs, the later ones a third
#                of them: docs/LOG.md, 2026-11-27, evening);
#   real_video   the ucf101-rgb job on the real-footage set (`.footage`, below) decoded on this node's CPUs
#                by OpenCV (the GPU image has no PyAV), UCF_EPOCHS epochs with the frame cache: the
#                job-over-bare-learner ratio for real video, and the feed's cost per kept frame;
#   finish       bench/gpu_report.py (the GPU targets from the steps above, as job.md), the archive, and
#                `ray stop`.
#
# Results: exactly two files under $OUT (default ./gpu_out), whatever ran: gpu_checks.tgz, every step's
# output (pytest.txt, learner_device.txt, memory_cap.txt, dataloader.txt, jobs.txt, job_demo.json and
# job_ucf101.json, the runs' summary.json, steps.txt: each step's seconds and exit status, and
# whatever the optional steps wrote), and job.md, the targets' table (also inside the archive). The
# device machine hands back at most 8 files of a run. Unpack the archive into bench/results/gpu/
# (bench/report.py puts its files in docs/BENCHMARKS.md). Optional steps, each set to 1 to run it,
# after the ones above and only in the time left before the deadline (raise BUDGET for them):
#   MBS=1        MBS Table 4 again with a real memory cap (about 8 minutes more);
#   STARTUP=1    bench/startup.py on this node's CPUs with GPU learners (startup.txt, about 2 minutes
#                more): where a GPU node's start-up goes, against a bare Ray Train trainer on the node;
#   BACKBONES=1  torchvision's r2plus1d_18 timed as a learner in fp32 and bf16 (backbones.txt, about a
#                minute more).
#
# The real-footage set: made here (it needs PyAV, which the GPU image lacks) and carried, e.g.
#     python -m raytrain_seq.data.footage --out .footage --clips-per-class 4 --codecs avi
# (about 12 MB; `.footage` is git-ignored: carry: [".gpu-ray", ".footage"]). FOOTAGE names another
# folder; without one the real_video step is skipped and job.md says so.
#
# Ray on a machine without network: a folder `.gpu-ray` at the root of this tree with Ray's wheel and
# an install.sh that unpacks it and defines `ray_stop` (the workplace's ray_for_gpu_box.sh tool makes
# it). `.gpu-ray` is ignored by git, so it does not travel with the tree by itself: name it in the device
# tool's `carry` (carry: [".gpu-ray"]). This script sources its install.sh (GPU_RAY names another
# folder). Without it, the Ray job is skipped and job.md says so.
#
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
set -u
cd "$(dirname "$0")/.."
BEGAN=$(date +%s)
BUDGET=${BUDGET:-420}
DEADLINE=$((BEGAN + BUDGET))
FINISH_S=20       # kept for the end: gpu_report, the archive, ray stop
REAL_VIDEO_S=75   # the real-video job's budget
FOOTAGE=${FOOTAGE:-.footage}
UCF_EPOCHS=${UCF_EPOCHS:-3}
# name and budget (s) of every default step, in order; tests/test_bench.py sums them against 420
STEPS=(
    "setup 30"
    "pytest 60"
    "learner 45"
    "memory_cap 40"
    "dataloader 40"
    "job_demo 35"
    "job_ucf101 75"
    "real_video $REAL_VIDEO_S"
    "finish $FINISH_S"
)
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
GPU_RAY=${GPU_RAY:-.gpu-ray}
RAY=0

# budget_of NAME: the budget of a step of STEPS; an optional step has none of its own (the time left).
budget_of() {
    local s
    for s in "${STEPS[@]}"; do [ "${s%% *}" = "$1" ] && echo "${s##* }"; done
    return 0
}

# step NAME FILE COMMAND...: COMMAND under timeout for min(NAME's budget, time left before the deadline
# less FINISH_S), its output appended to $WORK/FILE; one line per step in steps.txt.
step() {
    local name=$1 file=$2
    shift 2
    local own
    own=$(budget_of "$name")
    own=${own:-$BUDGET}
    local left=$((DEADLINE - FINISH_S - $(date +%s)))
    local limit=$((own < left ? own : left))
    if [ "$limit" -lt 5 ]; then
        echo "$name: skipped, ${left} s left before the deadline" | tee -a "$WORK/steps.txt"
        return 0
    fi
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >>"$WORK/$file" 2>&1
    rc=$?
    echo "$name: exit $rc after $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$WORK/steps.txt"
    tail -n 1 "$WORK/$file"
    return 0
}

stop_ray() {
    # ray_stop is a shell function of install.sh: run in the background, killed if it hangs.
    if [ "$RAY" = 1 ]; then
        ray_stop >>"$WORK/jobs.txt" 2>&1 &
        local pid=$! waited=0
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 15 ]; do sleep 1; waited=$((waited + 1)); done
        kill "$pid" 2>/dev/null
        echo "ray stopped (${waited} s)" >>"$WORK/steps.txt"
    fi
}

FINISHED=0
finish() {
    [ "$FINISHED" = 1 ] && return
    FINISHED=1
    stop_ray
    # The report reads the step files; it runs even when the deadline is near (its own 10 s).
    timeout --kill-after=2 10 python3 bench/gpu_report.py --out "$WORK" --md "$WORK/job.md" --json \
        >"$WORK/gpu_report.txt" 2>&1
    [ -f "$WORK/job.md" ] || echo "gpu_report.py wrote no table: see gpu_report.txt in the archive" >"$WORK/job.md"
    echo "total: $(($(date +%s) - BEGAN)) s of a $BUDGET s budget" >>"$WORK/steps.txt"
    tar -czf "$OUT/gpu_checks.tgz" -C "$WORK" .
    cp "$WORK/job.md" "$OUT/job.md"
    echo "gpu checks done in $(($(date +%s) - BEGAN)) s: $OUT/gpu_checks.tgz and $OUT/job.md"
}
trap finish EXIT
trap 'exit 143' INT TERM

# setup
timeout 5 nvidia-smi -L >"$WORK/setup.txt" 2>&1
step setup setup.txt python3 -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, torch.cuda.get_device_name(0))'
if [ -f "$GPU_RAY/install.sh" ]; then
    # shellcheck disable=SC1090,SC1091
    source "$GPU_RAY/install.sh" >>"$WORK/setup.txt" 2>&1 && RAY=1
    # The folder installs without bytecode (pip --no-compile); a pip install compiles it, and without it
    # every process of the job's start would compile Ray's modules again.
    step setup setup.txt python3 -m compileall -q -j 0 /tmp/site
fi

step pytest pytest.txt python3 -m pytest -q -p no:cacheprovider -m "not ray and not fault" -k "cuda or gpu" -rs \
    tests/test_step.py tests/test_microbatch.py tests/test_flat_storage.py tests/test_stream.py \
    tests/test_models.py tests/test_video_backbones.py tests/test_payload.py tests/test_averaging.py

step learner learner_device.txt python3 bench/learner_device.py --preset ucf101-rgb --precision bf16 \
    --steps 4 --rounds 2 --json
step memory_cap memory_cap.txt python3 bench/learner_device.py --preset ucf101-rgb --precision bf16 \
    --batch-size 576 --memory-cap-gib --json

step dataloader dataloader.txt python3 bench/dataloader_loop.py --preset ucf101-rgb --precision bf16 \
    --max-videos 1500 --epochs 2 --workers 8 --json

if [ "$RAY" = 1 ]; then
    RUNS=$(mktemp -d)
    COMMON=(--storage-path "$RUNS" --tracker none --use-gpu --gpus-per-learner 0.5 --learners 2)
    SYNTH=(--dataset synthetic --data-root none --num-classes 10 --max-videos 1500)
    step job_demo jobs.txt python3 jobs/ucf101.py --preset demo --run-name demo "${COMMON[@]}"
    cp "$RUNS/demo/summary.json" "$WORK/job_demo.json" 2>/dev/null
    stop_ray
    step job_ucf101 jobs.txt python3 jobs/ucf101.py --preset ucf101-rgb "${SYNTH[@]}" --epochs "$UCF_EPOCHS" \
        --precision bf16 --run-name ucf101 "${COMMON[@]}"
    cp "$RUNS/ucf101/summary.json" "$WORK/job_ucf101.json" 2>/dev/null
    stop_ray
else
    echo "job_demo, job_ucf101: skipped, no $GPU_RAY folder (see the header of this script)" | tee -a "$WORK/steps.txt"
fi

if [ "$RAY" = 1 ] && [ -f "$FOOTAGE/avi/train.txt" ]; then
    REAL=(--dataset list --data-root "$FOOTAGE/avi" --train-list "$FOOTAGE/avi/train.txt"
        --test-list "$FOOTAGE/avi/test.txt" --class-names "$FOOTAGE/avi/classes.txt" --decoder opencv)
    step real_video jobs.txt python3 jobs/ucf101.py --preset ucf101-rgb "${REAL[@]}" --epochs "$UCF_EPOCHS" \
        --precision bf16 --run-name real --frame-cache-dir "$RUNS/frames" "${COMMON[@]}"
    cp "$RUNS/real/summary.json" "$WORK/job_real.json" 2>/dev/null
    stop_ray
else
    echo "real_video: skipped, no Ray or no $FOOTAGE/avi/train.txt (see the header of this script)" | tee -a "$WORK/steps.txt"
fi

if [ "${STARTUP:-0}" = 1 ] && [ "$RAY" = 1 ]; then
    step startup startup.txt python3 bench/startup.py --epochs 1 --cpus "$(nproc)" --bare-runs 1 \
        --gpus-per-learner 0.5 --json
    stop_ray
fi

if [ "${BACKBONES:-0}" = 1 ]; then
    for precision in fp32 bf16; do
        step backbones backbones.txt python3 bench/learner_device.py --preset ucf101-rgb --backbone r2plus1d_18 \
            --precision "$precision" --steps 3 --rounds 1 --json
    done
fi

if [ "${MBS:-0}" = 1 ]; then
    # MBS Table 4 twice: micro-batches of 16 small images (launch-bound on a GPU), then micro-batches that
    # keep the GPU busy (512 images, 4x the channels), the paper's setting of a device its micro-batch fills.
    for run in "16 16 1024" "512 64 16384"; do
        set -- $run
        step mbs "mbs_micro$1.txt" python3 bench/microbatch.py --micro "$1" --width "$2" --max-size "$3"
    done
fi
