#!/bin/bash
# Issue 17 item 5: some units of the comparison on the device (H200), started there with setsid
# from the device checkout's root once the wheels are in /tmp/site and the model pieces in /root/m
# (as results/h200-gsm8k/README.md, "Device call sequence"). Usage:
#   UNITS=grpo_gs8-s0,gs1_kernel-s0 bash scripts/h200/comparison_device_units.sh
# The gates run first (as in any run; their results cache in the run directory), then only UNITS
# train and evaluate. Afterwards, on the development machine, from the fetched run directory:
#   gs1 decide --spec results/h200-comparison/spec_revised.json --units results/h200-comparison --collect RUN
set -u
: "${UNITS:?name the units, e.g. UNITS=grpo_gs8-s0,gs1_kernel-s0}"
W=/root/work; mkdir -p "$W"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
export GS1_LOCAL_CACHE=$W/cache GS1_COMPILE_CACHE=$W/compile GS1_MODEL_CACHE=$W/models
echo assembling > "$W/status"
if [ ! -s /root/m/model.gguf ]; then cat /root/m/p.* > /root/m/model.gguf && rm -f /root/m/p.*; fi
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  /root/m/model.gguf" | sha256sum -c - > "$W/model_sha.txt" 2>&1 \
  || { echo "model checksum failed" > "$W/status"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$W/gpu.txt"
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 1000 > "$W/gpu_samples.csv" &
SMI=$!
echo "running $UNITS" > "$W/status"
python3 -m gs1 run results/h200-comparison/spec_revised.json --units "$UNITS" --run-dir "$W/run" \
  --data-dir .data/gsm8k >> "$W/flow.log" 2>&1
rc=$?
kill $SMI
echo "done rc=$rc" > "$W/status"
