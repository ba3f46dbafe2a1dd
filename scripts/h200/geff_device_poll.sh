#!/bin/bash
# Waits up to ${WAIT:-560} s for geff_device_run.sh to finish and prints where it is. Each call
# brings back through $OUT (8 files of 16 MiB at most) every benchmark's finished log
# (<env>.parquet: written atomically, so a log under way is never taken half-written) and
# logs.tgz (status, the collection's terminal, summary.jsonl, the GPU and its versions, memory
# samples, the models' checks); once the run has ended, inductor's cache in 15 MB pieces
# (compile.tgz.NN) when they fit. A run that stops short ends the wait at once.
W=${GS1_DEVICE_WORK:-/root/work}  # the device run's folder (a test points it elsewhere)
BUSY="assembling|collecting"
. "$(dirname "$0")/device_lib.sh"
wait_for_run "$W" "$BUSY" "${WAIT:-560}"
grep -E "^\[(collect|embed)\]" "$W/collect.log" 2>/dev/null | tail -10
[ -n "${OUT:-}" ] || exit 0
for log in "$W"/logs/*.parquet; do [ -f "$log" ] && cp "$log" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read status collect.log logs/summary.jsonl times.txt gpu.txt \
  gpu_samples.csv model_sha.txt question_model_sha.txt compile_from.txt 2>/dev/null
run_ended "$W" "$BUSY" && pack_compile_cache "$W" "$OUT"
ls -la "$OUT"
