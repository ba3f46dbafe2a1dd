#!/bin/bash
# Waits up to ${WAIT:-560} s for comparison_device_units.sh to finish and prints where it is. Each
# call packs what is there into $OUT (at most 8 files of 16 MiB come back): one archive per unit
# whose eval file is written (its train/ and eval/ folders, no weights), and once the run has
# ended the rest of the run directory (gates, audits, feasibility, decision, .stage-results: the
# next session's stage cache), the logs, and inductor's cache in pieces (compile.tgz.NN) when they fit.
# A run that stopped short (e.g. "model checksum failed") ends the wait at once and brings back
# what it wrote of its start (tests/test_device_scripts.py).
W=${GS1_DEVICE_WORK:-/root/work}  # the device run's folder (a test points it elsewhere)
BUSY="assembling|running"
. "$(dirname "$0")/device_lib.sh"
# a failed start (e.g. "model checksum failed") must not hold the call, and the session's device
# time, for the whole WAIT
wait_for_run "$W" "$BUSY" "${WAIT:-560}"
grep -E "Finished in state|failed|Error|error:|gs1:|step [0-9]+/" "$W/flow.log" 2>/dev/null | tail -12
[ -n "${OUT:-}" ] || exit 0
# a run that ended short of all-done: what it wrote of its start (status, checksum, versions) comes back
if run_ended "$W" "$BUSY" && ! grep -q all-done "$W/status"; then
  tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read status model_sha.txt gpu.txt compile_from.txt flow.log 2>/dev/null
fi
cd "$W/run" 2>/dev/null || exit 0
for done_eval in eval/*/eval.jsonl; do
  [ -f "$done_eval" ] || continue
  unit=$(basename "$(dirname "$done_eval")")
  tar czf "$OUT/unit-$unit.tgz" --exclude='*.safetensors' --exclude='*.pt' "train/$unit" "eval/$unit"
done
if grep -q all-done "$W/status"; then
  tar czf "$OUT/run-rest.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='./train' --exclude='./eval' .
  tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read flow.log times.txt status gpu.txt gpu_samples.csv model_sha.txt compile_from.txt
  # last, so the units and logs are out first: inductor's cache in 15 MB pieces, for the next
  # session's COMPILE_FROM, when they fit the files left of the 8 that come back
  pack_compile_cache "$W" "$OUT"
fi
ls -la "$OUT"
