#!/bin/bash
# Issue 13's H200 run, started by the device command with setsid (it outlives one call) from the
# device checkout's root, once the wheels are installed in /tmp/site and the model pieces are in
# /root/m (README.md here: "Commands"). Writes everything under /root/work; `status` says how far.
set -u
W=/root/work; mkdir -p "$W"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
export GS1_LOCAL_CACHE=$W/cache GS1_COMPILE_CACHE=$W/compile
now() { python3 -c 'import time; print(f"{time.time():.3f}")'; }
echo assembling > "$W/status"
if [ ! -s /root/m/model.gguf ]; then cat /root/m/p.* > /root/m/model.gguf && rm -f /root/m/p.*; fi
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  /root/m/model.gguf" | sha256sum -c - > "$W/model_sha.txt" 2>&1 \
  || { echo "model checksum failed" > "$W/status"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$W/gpu.txt"
python3 -c 'import torch, transformers, peft, prefect, tinker, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "prefect", prefect.__version__, "tinker", tinker.__version__, "trl", trl.__version__)' >> "$W/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 500 > "$W/gpu_samples.csv" &
SMI=$!
echo running > "$W/status"
start=$(now)
python3 -m gs1 run results/h200-gsm8k/spec_revised.json --run-dir "$W/run" --data-dir .data/gsm8k > "$W/flow.log" 2>&1
rc=$?
echo "gs1 run: rc=$rc start=$start end=$(now)" >> "$W/flow.log"
kill $SMI
echo "run-done rc=$rc" > "$W/status"
[ "${SKIP_PEER:-0}" = 1 ] || python3 benchmarks/peer_trl.py --model /root/m/model.gguf --data-dir .data/gsm8k > "$W/peer.log" 2>&1
echo "all-done rc=$rc" > "$W/status"
