#!/bin/bash
# Units of a spec on the H200, some at a time (issues 24, 25; SPEC= another units spec, e.g. issue 50's
# results/h200-basic-arithmetic/spec_revised.json, default the card's comparison): started by the device
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
M=${GS1_DEVICE_MODELS:-/root/m}  # the model pieces' folder (a test points these folders elsewhere)
SPEC=${SPEC:-results/h200-comparison/spec_revised.json}
DATA=${GS1_DEVICE_DATA:-/root/data}
. "$(dirname "$0")/device_lib.sh"
device_env "$W"
# the pieces go only once the whole checks out: a failed check keeps them, and says which piece
# differs
start_run "$W" "$M" "$DATA" "$PWD/scripts/h200/model_pieces.sha256" || exit 1
# COMPILE_FROM: a folder holding compile.tgz.NN, inductor's cache as an earlier session's poll
# brought it back (carried as ".compile"): the learner's and decoder's kernels load, not compile.
unpack_compile_cache "$W" "${COMPILE_FROM:-}"
record_device "$W"
sample_gpu "$W"
# RESUME_FROM: an earlier session's run folder kept under results/h200-comparison/runs/ with its
# .stage-results: its gates come back Cached while rl/, schemas/ and the stages' sources are unchanged
if [ -n "${RESUME_FROM:-}" ] && [ ! -d "$W/run" ]; then
  mkdir -p "$W/run" && cp -a "$RESUME_FROM/." "$W/run/" && rm -f "$W/run/flow.log" "$W/run/gpu.txt" "$W/run/gpu_samples.csv" "$W/run/model_sha.txt"
fi
echo "running $UNITS" > "$W/status"
start=$(date +%s.%N)
python3 -m gs1 run "$SPEC" --units "$UNITS" --run-dir "$W/run" --data-dir "$DATA/gsm8k" > "$W/flow.log" 2>&1
rc=$?
# its own file: a line appended to flow.log could land under the process's own last writes
echo "gs1 run --units $UNITS: rc=$rc start=$start end=$(date +%s.%N)" > "$W/times.txt"
kill $SMI
echo "all-done rc=$rc" > "$W/status"
