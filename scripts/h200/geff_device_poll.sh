#!/bin/bash
# Waits up to ${WAIT:-560} s for geff_device_run.sh to finish and prints where it is. Each call
# brings back through $OUT (8 files of 16 MiB at most) every benchmark's finished log
# (<env>.parquet: written atomically, so a log under way is never taken half-written) and
# logs.tgz (status, the collection's terminal, summary.jsonl, the GPU and its versions, memory
# samples, the models' checks); once the run has ended, inductor's cache in 15 MB pieces
# (compile.tgz.NN) when they fit. A run that stops short ends the wait at once.
W=${GS1_DEVICE_WORK:-/root/work}  # the device run's folder (a test points it elsewhere)
end=$(( $(date +%s) + ${WAIT:-560} ))
ended() { [ -f "$W/status" ] && ! grep -qE '^(assembling|collecting)' "$W/status"; }
while [ "$(date +%s)" -lt "$end" ] && ! ended; do sleep 5; done
echo "status: $(cat "$W/status" 2>/dev/null)"
grep -E "^\[collect\]" "$W/collect.log" 2>/dev/null | tail -10
[ -n "${OUT:-}" ] || exit 0
for log in "$W"/logs/*.parquet; do [ -f "$log" ] && cp "$log" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read status collect.log logs/summary.jsonl times.txt gpu.txt \
  gpu_samples.csv model_sha.txt question_model_sha.txt compile_from.txt 2>/dev/null
if ended && [ -d "$W/compile" ]; then
  tar cf - -C "$W" compile | gzip -1 > "$W/compile.tgz"
  pieces=$(( ($(stat -c %s "$W/compile.tgz") + 14999999) / 15000000 )); left=$(( 8 - $(ls "$OUT" | wc -l) ))
  if [ "$pieces" -le "$left" ]; then split -b 15000000 -d -a 2 "$W/compile.tgz" "$OUT/compile.tgz."
  else echo "compile cache: $pieces pieces of 15 MB, $left files left to bring back: left on the machine"; fi
fi
ls -la "$OUT"
