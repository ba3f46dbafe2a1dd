#!/bin/bash
# Issue 23's H200 session, started by the device command with `setsid nohup` from the device
# checkout's root once the wheels are in /tmp/site and the model pieces in /root/m
# (results/h200-gsm8k/README.md, "Device call sequence"; carry [".data", ".tok", ".tree_commit"]).
# PARTS (default "learner clients adapters"; also spec, warm, peer, comparison, learner_compile,
# learner_paths, forms) picks the parts, run in that order, each one's output in its own file.
# Session5 ran "spec warm" and two rows of "adapters" in its 30 minutes, session6 "adapters
# comparison" and the peer's start, session7 "spec warm peer" while its learner and clients parts
# found no tokenizer (results/h200-multi-adapter/session7); the default is what that did not reach.
#   forms       `benchmarks/step_profile.py --adapters 1,2,6,12 --skip-train` for the bank's dense
#               and tiled decode forms (eager-captured, no compiling): profile_dense.txt,
#               profile_tiled.txt (measured in session4: tiled, now the default)
#   learner     the compiled learner at the user's shape (64 datums x 671 tokens), TF32 then IEEE
#               float32 (`GS1_TF32`), profiled by kernel kind (`step_profile.py --skip-decode`):
#               learner_tf32_1.txt, learner_tf32_0.txt; each on an empty inductor cache of its
#               own, so that both compile times are cold
#   learner_compile  `engine.py --skip-sample`: eager layers, then compiled (learner_compile_*.txt)
#   learner_paths  peft's path checkpointed, the fused path checkpointed, the engine's choice
#               (learner_*.txt; measured in session4)
#   spec        `gs1 run` of the user's spec (results/h200-gsm8k/spec_revised.json), cold, end to
#               end (flow.log)
#   comparison  the six arms of seed 0 of the card's comparison for 4 steps, cold (comparison.log)
#   warm        the user's spec again up to feasibility on the caches `spec` left, in a new
#               process (warm.log; stopped once feasibility is written; its start and that
#               moment in warm_times.txt, for `stage_timings.py --start`)
#   adapters    `benchmarks/engine_speed.py --adapters 1,2,6,12`, compiled (adapters.txt)
#   peer        the TRL peer against our grpo_gs8 arm (peer.txt)
#   clients     `benchmarks/client_setup.py` on the GPU: a client's creation, the tokenizer copy's
#               share (clients.txt; a client took 3.3 s in session6's comparison)
# Writes everything under /root/work; `status` there says how far it got.
set -u
W=/root/work; mkdir -p "$W"
PARTS=${PARTS:-learner clients adapters}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
export GS1_LOCAL_CACHE=$W/cache
now() { date +%s.%N; }
echo assembling > "$W/status"
mkdir -p /root/data && cp -r .data/gsm8k /root/data/ 2>/dev/null
# the carried tokenizer, kept out of the checkout: a later device call's fresh tree no longer has
# .tok (session7's learner and clients parts, run in the second call, found it gone)
if [ -d .tok ]; then rm -rf /root/tok && cp -r .tok /root/tok; fi
if [ ! -s /root/m/model.gguf ]; then cat /root/m/q.* > /root/m/model.gguf && rm -f /root/m/q.*; fi
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  /root/m/model.gguf" | sha256sum -c - > "$W/model_sha.txt" 2>&1 \
  || { echo "model checksum failed" > "$W/status"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$W/gpu.txt"
python3 -c 'import torch, transformers, peft, prefect, tinker; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__, "peft", peft.__version__, "prefect", prefect.__version__, "tinker", tinker.__version__)' >> "$W/gpu.txt" 2>&1
cat .tree_commit >> "$W/gpu.txt" 2>/dev/null  # the tree that ran (the device copy's .git is stale)
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 500 > "$W/gpu_samples.csv" &
SMI=$!
B15="--config qwen2.5-1.5b --batch 64 --new-tokens 512 --prompt-tokens 160 --rank 32 --device cuda --tokenizer-dir /root/tok"
SPEC=results/h200-gsm8k/spec_revised.json

forms() {
  for form in dense tiled; do
    python3 benchmarks/step_profile.py --config qwen2.5-1.5b --device cuda --adapters 1,2,6,12 --skip-train \
      --bank-decode $form --tokenizer-dir /root/tok > "$W/profile_$form.txt" 2>&1
  done
}

learner() {
  for t in 1 0; do
    GS1_TF32=$t GS1_COMPILE_CACHE=$W/compile-tf32-$t python3 benchmarks/step_profile.py --config qwen2.5-1.5b --device cuda \
      --skip-decode --tokenizer-dir /root/tok > "$W/learner_tf32_$t.txt" 2>&1
  done
}

learner_compile() {
  for c in off on; do
    GS1_COMPILE_CACHE=$W/compile-learner python3 benchmarks/engine_speed.py $B15 --skip-sample --repeats 3 \
      --compile-learner $c > "$W/learner_compile_$c.txt" 2>&1
  done
}

learner_paths() {
  for v in "peft on" "fused on" "fused auto"; do
    set -- $v
    python3 benchmarks/engine_speed.py $B15 --skip-sample --repeats 2 --learner-lora $1 --gradient-checkpointing $2 \
      > "$W/learner_$1_$2.txt" 2>&1
  done
}

spec() {
  local start=$(now)
  GS1_COMPILE_CACHE=$W/compile-spec GS1_MODEL_CACHE=$W/models-spec python3 -m gs1 run $SPEC \
    --run-dir "$W/run" --data-dir /root/data/gsm8k > "$W/flow.log" 2>&1
  echo "gs1 run: rc=$? start=$start end=$(now)" >> "$W/flow.log"
}

comparison() {
  local start=$(now)
  GS1_COMPILE_CACHE=$W/compile GS1_MODEL_CACHE=$W/models python3 -m gs1 run results/h200-multi-adapter/spec_comparison_4steps.json \
    --run-dir "$W/comparison" --data-dir /root/data/gsm8k \
    --units grpo_gs8-s0,gs1_kernel-s0,gs1_kernel_hillclimbed-s0,batch_mean-s0,flash_reinforce-s0,critic-s0 \
    > "$W/comparison.log" 2>&1
  echo "gs1 run: rc=$? start=$start end=$(now)" >> "$W/comparison.log"
}

warm() {  # a fresh run directory, the caches of `spec`: model, tokenizer and compiled kernels warm
  local start=$(now)
  GS1_COMPILE_CACHE=$W/compile-spec GS1_MODEL_CACHE=$W/models-spec setsid python3 -m gs1 run $SPEC \
    --run-dir "$W/run-warm" --data-dir /root/data/gsm8k > "$W/warm.log" 2>&1 &
  local pid=$!
  while kill -0 $pid 2>/dev/null && [ ! -s "$W/run-warm/feasibility/feasibility.json" ]; do sleep 2; done
  # its own file: the process writes warm.log at its own offset, over a line appended here (session7)
  echo "feasibility written: start=$start end=$(now)" > "$W/warm_times.txt"
  kill -TERM -- -$pid 2>/dev/null; wait $pid 2>/dev/null
}

adapters() {
  GS1_COMPILE_CACHE=$W/compile-bench python3 benchmarks/engine_speed.py $B15 --adapters 1,2,6,12 --repeats 1 \
    > "$W/adapters.txt" 2>&1
}

peer() {  # on the model `spec` kept (each side loads it in seconds, not a minute of dequantising)
  GS1_MODEL_CACHE=$W/models-spec python3 benchmarks/peer_trl.py --model /root/m/model.gguf --data-dir /root/data/gsm8k --steps 4 > "$W/peer.txt" 2>&1
}

clients() {
  python3 benchmarks/client_setup.py --config qwen2.5-1.5b --tokenizer-dir /root/tok --device cuda --clients 5 \
    > "$W/clients.txt" 2>&1
}

for part in $PARTS; do
  echo "$part" > "$W/status"
  $part
done
kill $SMI
echo "all-done" > "$W/status"
