#!/bin/bash
# The card's comparison on the H200, some units at a time (issues 24, 25): started by the device
# command with `setsid nohup` from the device checkout's root once the wheels are in /tmp/site and
# the model pieces (q.00..q.18) in /root/m (results/h200-gsm8k/README.md, "Device call sequence";
# carry [".data", ".tree_commit"]). Usage:
#   UNITS=grpo_gs8-s0,gs1_kernel-s0 [RESUME_FROM=results/h200-comparison/runs/<run>] [COMPILE_FROM=.compile] \
#     setsid nohup bash scripts/h200/comparison_device_units.sh &
#   WAIT=560 bash scripts/h200/comparison_device_poll.sh      # in the same call, then again
# The gates run first, as in any run (their results cache in the run directory's .stage-results:
# a later session that brings this run directory back finds them Cached), then the units train
# side by side on one shared base and evaluate. Back on the development machine, from the fetched
# and unpacked run directory RUN:
#   gs1 decide --spec results/h200-comparison/spec_revised.json --units results/h200-comparison --collect RUN
# Everything is written under /root/work; `status` there says how far it got.
set -u
: "${UNITS:?name the units, e.g. UNITS=grpo_gs8-s0,gs1_kernel-s0}"
W=${GS1_DEVICE_WORK:-/root/work}; mkdir -p "$W"
SPEC=${SPEC:-results/h200-comparison/spec_revised.json}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
export GS1_LOCAL_CACHE=$W/cache GS1_COMPILE_CACHE=$W/compile GS1_MODEL_CACHE=$W/models
# inductor's cache named outright: `import torch` already pins TORCHINDUCTOR_CACHE_DIR to
# /tmp/torchinductor_<user>, so the engine's GS1_COMPILE_CACHE default never reaches inductor
export TORCHINDUCTOR_CACHE_DIR=$W/compile
echo assembling > "$W/status"
mkdir -p /root/data && cp -r .data/gsm8k /root/data/ 2>/dev/null
if [ ! -s /root/m/model.gguf ]; then cat /root/m/q.* > /root/m/model.gguf; fi
# the pieces go only once the whole checks out: a failed check keeps them, and says which piece
# differs
if echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  /root/m/model.gguf" | sha256sum -c - > "$W/model_sha.txt" 2>&1; then
  rm -f /root/m/q.*
else
  # each piece against its committed sum (scripts/h200/model_pieces.sha256): the failed one is named
  { ls -la /root/m; (cd /root/m && sha256sum -c "$OLDPWD/scripts/h200/model_pieces.sha256"); df -h /root; } >> "$W/model_sha.txt" 2>&1
  rm -f /root/m/model.gguf
  echo "model checksum failed" > "$W/status"; exit 1
fi
# COMPILE_FROM: a folder holding compile.tgz.NN, inductor's cache as an earlier session's poll
# brought it back (carried as ".compile"): the learner's and decoder's kernels load, not compile.
# Before anything imports torch: an import may make $W/compile, and an existing folder read as
# "already unpacked" (session 13 compiled afresh so). Its own file: gpu.txt is written below.
if [ -n "${COMPILE_FROM:-}" ] && [ -z "$(ls -A "$W/compile" 2>/dev/null)" ] && ls "$COMPILE_FROM"/compile.tgz.?? > /dev/null 2>&1; then
  cat "$COMPILE_FROM"/compile.tgz.?? | tar xzf - -C "$W" && echo "compile cache: $(du -sh "$W/compile" | cut -f1) from $COMPILE_FROM" > "$W/compile_from.txt"
fi
[ -s "$W/compile_from.txt" ] || echo "compile cache: none unpacked (COMPILE_FROM=${COMPILE_FROM:-}, pieces: $(ls "${COMPILE_FROM:-.compile}" 2>&1 | tr '\n' ' '), $W/compile: $(ls -A "$W/compile" 2>/dev/null | wc -l) entries)" > "$W/compile_from.txt"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$W/gpu.txt"
python3 -c 'import torch, transformers, peft, prefect, tinker; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__, "peft", peft.__version__, "prefect", prefect.__version__, "tinker", tinker.__version__)' >> "$W/gpu.txt" 2>&1
cat .tree_commit >> "$W/gpu.txt" 2>/dev/null  # the tree that ran (the device copy's .git is stale)
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 2000 > "$W/gpu_samples.csv" &
SMI=$!
# RESUME_FROM: an earlier session's run folder kept under results/h200-comparison/runs/ with its
# .stage-results: its gates come back Cached while rl/, schemas/ and the stages' sources are unchanged
if [ -n "${RESUME_FROM:-}" ] && [ ! -d "$W/run" ]; then
  mkdir -p "$W/run" && cp -a "$RESUME_FROM/." "$W/run/" && rm -f "$W/run/flow.log" "$W/run/gpu.txt" "$W/run/gpu_samples.csv" "$W/run/model_sha.txt"
fi
echo "running $UNITS" > "$W/status"
start=$(date +%s.%N)
python3 -m gs1 run "$SPEC" --units "$UNITS" --run-dir "$W/run" --data-dir /root/data/gsm8k > "$W/flow.log" 2>&1
rc=$?
# its own file: a line appended to flow.log could land under the process's own last writes
echo "gs1 run --units $UNITS: rc=$rc start=$start end=$(date +%s.%N)" > "$W/times.txt"
kill $SMI
echo "all-done rc=$rc" > "$W/status"
