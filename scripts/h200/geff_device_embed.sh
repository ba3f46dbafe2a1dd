#!/bin/bash
# The policy's prompt embedding added on the H200 to rollout logs collected without it
# (scripts/h200/embed_rollout_logs.py): issue 26's first logs came back without the column, the
# engine having lost its hidden-state hook. Needs only the wheels in /tmp/site and the policy's
# pieces in /root/m (no question model); carry [".data", ".tree_commit", ".geff_logs"] (the logs):
#   GS1_DEVICE_WORK=/root/embed setsid nohup bash scripts/h200/geff_device_embed.sh > /root/embed.out 2>&1 < /dev/null &
#   sleep 3; GS1_DEVICE_WORK=/root/embed WAIT=300 bash scripts/h200/geff_device_poll.sh
# The logs come back from W/logs, each under its own name, through geff_device_poll.sh.
set -u
W=${GS1_DEVICE_WORK:-/root/embed}; mkdir -p "$W"
M=${GS1_DEVICE_MODELS:-/root/m}
LOGS=${LOGS:-.geff_logs}
MODEL_SUMS=${MODEL_SUMS:-$PWD/scripts/h200/model_pieces.sha256}
DATA=${GS1_DEVICE_DATA:-/root/data}
. "$(dirname "$0")/device_lib.sh"
device_env "$W"
start_run "$W" "$M" "$DATA" "$MODEL_SUMS" || exit 1
record_device "$W"
echo "collecting prompt embeddings" > "$W/status"
start=$(date +%s.%N)
python3 scripts/h200/embed_rollout_logs.py --base-model-path "$M/model.gguf" --data-dir "$DATA/gsm8k" \
  --out "$W/logs" "$LOGS"/*.parquet > "$W/collect.log" 2>&1
rc=$?
echo "embed_rollout_logs.py: rc=$rc start=$start end=$(date +%s.%N)" > "$W/times.txt"
echo "all-done rc=$rc" > "$W/status"
