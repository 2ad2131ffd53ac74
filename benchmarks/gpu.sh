#!/bin/bash
# The GPU figures of docs/benchmarks/cost.md (GPU readiness), as they were taken on a one-H100 machine (16 cores):
# the loader's share of a paper-size (384 px) site task on the GPU, with and without loader workers and mixed
# precision, and paper-size Fed-LWR in the simulator on GPU 0. Paper-size data is generated on first use
# (about 2.5 minutes, 439 MB). FAIRFL_PRESET=paper sets 200 rounds: each run is cut at SECONDS and keeps the rounds
# it finished (results.json is written every round).
#   bash benchmarks/gpu.sh [SECONDS]      # writes benchmarks/results/gpu/ (OUT=folder to change)
set -u
SECONDS_PER_RUN=${1:-240}
OUT=${OUT:-benchmarks/results/gpu}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/custom${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
for options in "" "--amp" "--workers 4" "--workers 4 --amp"; do
  name=$(echo "h100 $options" | tr -d '-' | tr ' ' '_' | sed 's/workers_/w/; s/_$//')
  python benchmarks/data_loading.py --preset paper --device cuda --rounds 3 $options --out "$OUT/data_loading_paper_$name.json"
done
for arguments in "amp=false loader_workers=0" "amp=true loader_workers=4"; do
  name=$(echo "$arguments" | sed 's/ loader_workers=0//; s/ loader_workers=/_w/; s/=/_/g')
  sets=$(for a in $arguments; do printf -- '--set %s ' "$a"; done)
  FAIRFL_PRESET=paper timeout "$SECONDS_PER_RUN" python -m fairfl.cli run jobs/fedlwr --gpu 0 $sets -w "/tmp/fairfl_gpu_$name" --force -q
  cp "$(find "/tmp/fairfl_gpu_$name" -name results.json | head -1)" "$OUT/fedlwr_paper_h100_$name.json"
done
# the sites on the host's CPU cores, CUDA hidden (memory as on a CPU site with torch's CUDA build)
CUDA_VISIBLE_DEVICES= python benchmarks/scale.py --sites 6 20 50 --rounds 4 --out "$OUT/scale_16core_host.json"
