#!/bin/bash
# Where a round's time goes on GPU sites: paper-size FedAvg, Fed-LWR and FedFloor (384 px slices, the five-level
# U-Net, six sites on GPU 0) and FedAvg on the built-in 3-D volumes (SegResNet, the jobs' 3-D size), each cut at SECONDS and keeping the
# rounds it finished (results.json is written every round), with the GPU's utilisation sampled every 200 ms.
# BASE=folder: also Fed-LWR with the fairfl package in BASE/custom (an earlier commit: `git archive COMMIT custom | tar
# x -C BASE`), on the same machine, for a before/after; with LONG=SECONDS both once more, cut at LONG. The summary:
# python benchmarks/gpu_round.py OUT.
#   bash benchmarks/gpu_round.sh [SECONDS_2D] [SECONDS_3D]   # writes OUT (default benchmarks/results/gpu_round)
# PRESET=cpu GPU= runs the same at CPU size without a GPU (a smoke test of this script). PYTHON: the interpreter.
set -u
SECONDS_2D=${1:-65}
SECONDS_3D=${2:-110}
OUT=${OUT:-benchmarks/results/gpu_round}
PRESET=${PRESET-paper}
GPU=${GPU-0}
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
PACKAGE=${PACKAGE:-$PWD}  # where the fairfl package measured is (PACKAGE/custom): this checkout by default
mkdir -p "$OUT"
gpu_option=${GPU:+--gpu $GPU}
mark() { echo "$(date '+%Y/%m/%d %H:%M:%S.%3N') $1 $2" >> "$OUT/marks.txt"; }
: > "$OUT/marks.txt"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 \
    > "$OUT/utilization.csv" &
  sampler=$!
fi
nproc > "$OUT/cores.txt"
PYTHONPATH=$PACKAGE/custom${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" -c "import monai, nvflare, torch, fairfl.benchmark.runner as r
print(r.versions(), 'cuda' if torch.cuda.is_available() else 'cpu')" > "$OUT/versions.txt" 2>&1

# the 2-D paper-size data takes minutes to generate: in the background while the 3-D run goes
FAIRFL_PRESET=$PRESET PYTHONPATH=$PACKAGE/custom${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" -m fairfl.cli prepare-data --dataset prostate \
  $([ "$PRESET" = paper ] && echo --image-size 384) > "$OUT/prepare_2d.log" 2>&1 &
prepare_2d=$!

run() {  # NAME SECONDS PACKAGE_ROOT JOB [fairfl run options...]
  local name=$1 seconds=$2 root=$3 job=$4
  shift 4
  mark start "$name"
  # SIGINT, as Ctrl-C: an earlier package (BASE) leaves the simulator running on after SIGTERM
  FAIRFL_PRESET=${RUN_PRESET:-$PRESET} PYTHONPATH=$root/custom${PYTHONPATH:+:$PYTHONPATH} \
    timeout -s INT -k 30 "$seconds" "$PYTHON" -m fairfl.cli run "jobs/$job" $gpu_option \
    -w "/tmp/fairfl_gpu_round_$name" --force -q "$@" > "$OUT/$name.log" 2>&1
  mark end "$name"
  local results
  results=$(find "/tmp/fairfl_gpu_round_$name" -name results.json | head -1)
  [ -n "$results" ] && cp "$results" "$OUT/${name}_results.json"
}

PYTHONPATH=$PACKAGE/custom${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" -m fairfl.cli prepare-data --dataset prostate3d > "$OUT/prepare_3d.log" 2>&1
RUN_PRESET=cpu run fedavg_3d "$SECONDS_3D" "$PACKAGE" fedavg --set 'dataset="prostate3d"' --set 'model="SegResNet"' \
  --set 'model_args={"init_filters":8}' --set num_rounds=100 --set eval_every=100
wait "$prepare_2d"
for job in fedavg fedlwr fedfloor; do
  run "$job" "$SECONDS_2D" "$PACKAGE" "$job" --set eval_every=100
done
if [ -n "${BASE:-}" ]; then
  run fedlwr_base "$SECONDS_2D" "$BASE" fedlwr --set eval_every=100
fi
if [ -n "${LONG:-}" ] && [ -n "${BASE:-}" ]; then  # LONG=SECONDS: Fed-LWR after and before again, for more rounds
  run fedlwr_long "$LONG" "$PACKAGE" fedlwr --set eval_every=100
  run fedlwr_base_long "$LONG" "$BASE" fedlwr --set eval_every=100
fi
[ -n "${sampler:-}" ] && kill "$sampler"
ls -la "$OUT"
