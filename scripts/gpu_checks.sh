#!/usr/bin/env bash
# The checks that need a GPU, as one short run on a bare CUDA machine with PyTorch and no Ray (the
# device machine a session is sometimes lent): the CUDA cases of the Ray-free tests, one learner's
# step on the GPU (bench/learner_device.py), a round's copies to the host and back
# (bench/flat_device.py), and MBS Table 4 with a real memory cap (bench/microbatch.py). Logs and result
# files go to $OUT (default: ./gpu_out); bench/results/gpu/ holds the last run's (bench/report.py puts
# them in docs/BENCHMARKS.md). About 5 minutes on an H200.
#
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

nvidia-smi -L
python3 -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, torch.cuda.get_device_name(0))'

# Every test that needs neither Ray nor PyAV nor tensorboardX; the CUDA cases run here instead of skipping.
# The modules ignored import those at collection; the tests that start Ray are marked `ray`.
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not ray and not fault" -rs \
    --continue-on-collection-errors \
    --ignore=tests/test_bad_inputs.py --ignore=tests/test_cluster_yaml.py --ignore=tests/test_preflight.py \
    --ignore=tests/test_real_video.py --ignore=tests/test_tracking.py --ignore=tests/test_video_readers.py \
    tests 2>&1 | tee "$OUT/pytest.txt" | grep -E "cuda|CUDA|GPU|passed|failed|FAILED|ERROR|SKIPPED"

timeout 120 python3 bench/learner_device.py --preset ucf101-rgb --json 2>&1 | tee "$OUT/learner_device_ucf101.txt"
timeout 45 python3 bench/learner_device.py --preset demo --json 2>&1 | tee "$OUT/learner_device_demo.txt"
timeout 90 python3 bench/learner_device.py --preset ucf101-rgb --precision bf16 --json 2>&1 \
    | tee "$OUT/learner_device_ucf101_bf16.txt"
# A round's device side (issue 12): the state to pinned host memory through the flat buffers, and back.
timeout 60 python3 bench/flat_device.py --json 2>&1 | tee "$OUT/flat_device.txt"

# MBS Table 4 twice: the CPU configuration (micro-batches of 16 small images: on a GPU every kernel is
# launch-bound, so the overhead column measures kernel launches), then micro-batches that keep the GPU
# busy (512 images, 4x the channels), the paper's setting of a device filled by its micro-batch.
for run in "16 16 1024" "512 64 16384"; do
    set -- $run
    timeout 240 python3 bench/microbatch.py --micro "$1" --width "$2" --max-size "$3" 2>&1 \
        | tee "$OUT/microbatch_micro$1.txt" | grep -E "^\* (Overhead|Gradients|Memory)"
    for ext in md json png; do cp "bench/results/microbatch.$ext" "$OUT/microbatch_micro$1.$ext"; done
    sed -i "s/](microbatch.png)/](microbatch_micro$1.png)/" "$OUT/microbatch_micro$1.md"
done
git checkout -- bench/results/microbatch.md bench/results/microbatch.json bench/results/microbatch.png 2>/dev/null
echo "gpu checks done: copy $OUT/microbatch_micro* and $OUT/learner_device_*.txt to bench/results/gpu/"
