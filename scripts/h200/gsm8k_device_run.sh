#!/bin/bash
# Issue 21's H200 run, started by the device command with `setsid nohup` from the device checkout's
# root once the wheels are in /root/whl and the model pieces in /root/m (results/h200-gsm8k/README.md, "Device call sequence").
# 1. the attention probe benchmark; 2. the cold `gs1 run` of the revised spec to its decision;
# 3. `gs1 replay` of any non-finite dump; 4. a second, warm process (compile and model caches
# filled by the first) on a fresh run directory, stopped once feasibility has finished.
# Writes everything under /root/work; `status` there says how far it got. Its output: results/h200-gsm8k/.
set -u
W=/root/work; mkdir -p "$W"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
export GS1_LOCAL_CACHE=$W/cache GS1_COMPILE_CACHE=$W/compile GS1_MODEL_CACHE=$W/models
# inductor's cache named outright: `import torch` already pins TORCHINDUCTOR_CACHE_DIR to
# /tmp/torchinductor_<user>, so the engine's GS1_COMPILE_CACHE default never reaches inductor
export TORCHINDUCTOR_CACHE_DIR=$W/compile
SPEC=results/h200-gsm8k/spec_revised.json
now() { date +%s.%N; }
echo assembling > "$W/status"
if [ ! -s /root/m/model.gguf ]; then cat /root/m/q.* > /root/m/model.gguf && rm -f /root/m/q.*; fi
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  /root/m/model.gguf" | sha256sum -c - > "$W/model_sha.txt" 2>&1 \
  || { echo "model checksum failed" > "$W/status"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$W/gpu.txt"
python3 -c 'import torch, transformers, peft, prefect, tinker; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__, "peft", peft.__version__, "prefect", prefect.__version__, "tinker", tinker.__version__)' >> "$W/gpu.txt" 2>&1
echo probe > "$W/status"
python3 benchmarks/attention_probe.py > "$W/attention_probe.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 500 > "$W/gpu_samples.csv" &
SMI=$!
echo cold > "$W/status"
start=$(now)
python3 -m gs1 run "$SPEC" --run-dir "$W/run" --data-dir /root/data/gsm8k > "$W/flow.log" 2>&1
rc=$?
echo "gs1 run: rc=$rc start=$start end=$(now)" >> "$W/flow.log"
for d in "$W"/run/nonfinite/*/*/; do
  [ -d "$d" ] && python3 -m gs1 replay "$d" > "$d/replay.txt" 2>&1
done
echo "warm (cold rc=$rc)" > "$W/status"
start2=$(now)
setsid python3 -m gs1 run "$SPEC" --run-dir "$W/warm" --data-dir /root/data/gsm8k > "$W/warm.log" 2>&1 &
P=$!
while kill -0 $P 2>/dev/null && ! grep -q "Task run 'feasibility.*Finished" "$W/warm.log"; do sleep 1; done
end2=$(now)
kill -- -$P 2>/dev/null; sleep 2; kill -9 -- -$P 2>/dev/null
echo "warm gs1 run: start=$start2 feasibility_finished=$end2" >> "$W/warm.log"
kill $SMI
echo "all-done rc=$rc" > "$W/status"
