#!/usr/bin/env bash
# The checks that need a GPU, as one run of at most 8 minutes on a bare CUDA machine with PyTorch (the
# device machine a session is sometimes lent). With Ray brought there (`.gpu-ray`, below) it runs the Ray
# job itself, the way users run it:
#
#   1. the CUDA cases of the Ray-free tests of what issue 40 changed (micro-batch streaming of the
#      input, recurrent weights in one chunk, the learner's step and evaluation on the device);
#   2. one bare learner's step (bench/learner_device.py, ucf101-rgb, bf16): the rate the job is measured
#      against, and the streaming check under a memory cap (B = 576 blocks, streamed against staged whole);
#   3. the plain PyTorch loop a user would otherwise write (bench/dataloader_loop.py: per-video padding,
#      CPU augmentation in 8 DataLoader workers) over the same synthetic videos;
#   4. the Ray job (jobs/ucf101.py, a local Ray of this node): the demo preset, then the ucf101-rgb model
#      on the synthetic set in bf16 with 2 learners sharing the GPU (--gpus-per-learner 0.5), 6 epochs
#      (epoch 0 computes every video's partial augmentation on the CPUs, the later ones a third of them:
#      docs/LOG.md, 2026-11-27, evening);
#   5. bench/gpu_report.py: the targets of issue 40 from 2-4, as a table (job.md).
#
# Results go to $OUT (default ./gpu_out), at most 8 files: pytest.txt, learner_device.txt,
# memory_cap.txt, dataloader.txt, job_demo.json, job_ucf101.json (the runs' summary.json), jobs.txt
# (their logs), job.md. Copy job.md and the .txt files to bench/results/gpu/ (bench/report.py puts them
# in docs/BENCHMARKS.md). Optional steps, each set to 1 to run it:
#   MBS=1        MBS Table 4 again with a real memory cap (about 8 minutes more);
#   STARTUP=1    bench/startup.py on this node's CPUs with GPU learners (startup.txt, about 2 minutes
#                more): where a GPU node's start-up goes, against a bare Ray Train trainer on the node;
#   BACKBONES=1  torchvision's r2plus1d_18 timed as a learner in fp32 and bf16 (backbones.txt, about a
#                minute more).
#
# Ray on a machine without network: a folder `.gpu-ray` beside this tree (git-ignored) with Ray's wheel
# and an install.sh that unpacks it and defines `ray_stop` (the workplace's ray_for_gpu_box.sh tool makes
# it); it travels with the tree and this script sources its install.sh. Without it, step 4 is skipped and
# step 5 says so. The script ends with `ray stop`: Ray's daemons left running would hold the GPU.
#
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
RAY=0
if [ -f .gpu-ray/install.sh ]; then
    # shellcheck disable=SC1091
    source .gpu-ray/install.sh && RAY=1
    # The folder installs without bytecode (pip --no-compile); a pip install compiles it, and without it
    # every process of the job's start would compile Ray's modules again.
    python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
fi
ray_down() { if [ "$RAY" = 1 ]; then ray_stop; fi; }
trap ray_down EXIT

nvidia-smi -L
python3 -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, torch.cuda.get_device_name(0))'

# 1. The CUDA cases of the Ray-free tests that exercise the learner's device path; the CPU cases of the
# same files too (the modules ignored import Ray at collection, or PyAV, which the machine lacks).
timeout 120 python3 -m pytest -q -p no:cacheprovider -m "not ray and not fault" -rs \
    tests/test_step.py tests/test_microbatch.py tests/test_flat_storage.py tests/test_stream.py \
    tests/test_models.py tests/test_payload.py tests/test_averaging.py 2>&1 \
    | tee "$OUT/pytest.txt" | grep -E "cuda|CUDA|passed|failed|FAILED|ERROR"

# 2. The bare learner (the job's limit) and the streaming check under a memory cap.
timeout 100 python3 bench/learner_device.py --preset ucf101-rgb --precision bf16 --steps 4 --rounds 2 --json \
    2>&1 | tee "$OUT/learner_device.txt"
timeout 150 python3 bench/learner_device.py --preset ucf101-rgb --precision bf16 --batch-size 576 \
    --memory-cap-gib --json 2>&1 | tee "$OUT/memory_cap.txt"

# 3. The plain PyTorch DataLoader loop over the job's videos.
SYNTH=(--dataset synthetic --data-root none --num-classes 10 --max-videos 1500)
timeout 100 python3 bench/dataloader_loop.py --preset ucf101-rgb --precision bf16 --max-videos 1500 \
    --epochs 2 --workers 8 --json 2>&1 | tee "$OUT/dataloader.txt"

# 4. The Ray job: each run starts a local Ray of this node's CPUs and its GPU.
if [ "$RAY" = 1 ]; then
    RUNS=$(mktemp -d)
    COMMON=(--storage-path "$RUNS" --tracker none --use-gpu --gpus-per-learner 0.5 --learners 2)
    timeout 120 python3 jobs/ucf101.py --preset demo --run-name demo "${COMMON[@]}" 2>&1 \
        | tee "$OUT/jobs.txt" | grep -E "training on|test accuracy|summary written|Error|error"
    cp "$RUNS/demo/summary.json" "$OUT/job_demo.json" 2>/dev/null
    ray_stop
    timeout 240 python3 jobs/ucf101.py --preset ucf101-rgb "${SYNTH[@]}" --epochs 6 --precision bf16 \
        --run-name ucf101 "${COMMON[@]}" 2>&1 | tee -a "$OUT/jobs.txt" \
        | grep -E "training on|round|test accuracy|summary written|Error|error"
    cp "$RUNS/ucf101/summary.json" "$OUT/job_ucf101.json" 2>/dev/null
    ray_stop
else
    echo "no .gpu-ray folder: the Ray job is not run (see the header of this script)"
fi

# 5. Issue 40's targets, from the files above.
python3 bench/gpu_report.py --out "$OUT" --md "$OUT/job.md" --json

if [ "${STARTUP:-0}" = 1 ] && [ "$RAY" = 1 ]; then
    timeout 180 python3 bench/startup.py --epochs 1 --cpus "$(nproc)" --bare-runs 1 --gpus-per-learner 0.5 \
        --json 2>&1 | tee "$OUT/startup.txt" | tail -n 1
    ray_stop
fi

if [ "${BACKBONES:-0}" = 1 ]; then
    for precision in fp32 bf16; do
        timeout 90 python3 bench/learner_device.py --preset ucf101-rgb --backbone r2plus1d_18 \
            --precision "$precision" --steps 3 --rounds 1 --json 2>&1 | tee -a "$OUT/backbones.txt" | tail -n 1
    done
fi

if [ "${MBS:-0}" = 1 ]; then
    # MBS Table 4 twice: micro-batches of 16 small images (launch-bound on a GPU), then micro-batches that
    # keep the GPU busy (512 images, 4x the channels), the paper's setting of a device its micro-batch fills.
    for run in "16 16 1024" "512 64 16384"; do
        set -- $run
        timeout 240 python3 bench/microbatch.py --micro "$1" --width "$2" --max-size "$3" 2>&1 \
            | grep -E "^\* (Overhead|Gradients|Memory)"
    done
fi
echo "gpu checks done: copy $OUT/job.md and $OUT/*.txt to bench/results/gpu/"
