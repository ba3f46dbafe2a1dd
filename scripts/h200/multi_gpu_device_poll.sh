#!/bin/bash
# Waits up to ${WAIT:-540} s for multi_gpu_device_run.sh and prints where it is. Each part comes back
# into $OUT in the call that first sees it done (W/parts), once, without weights: inprocess.tgz.NN,
# dispatch.tgz.NN (the run directory, the workers' and the server's logs); once the run has ended,
# logs.tgz (status, times, versions, every GPU's samples) and inductor's cache (compile.tgz.NN)
# when it fits. A run that stopped short (e.g. "model checksum failed") ends the wait at once.
W=${GS1_DEVICE_WORK:-/root/work}
BUSY="assembling|running"
. "$(dirname "$0")/device_lib.sh"
pack_parts() {
  for part in inprocess dispatch; do
    grep -qx "$part-done" "$W/parts" 2>/dev/null && pack_part "$W" "$OUT" "$part"
  done
}
end=$(( $(date +%s) + ${WAIT:-540} ))
until pack_parts; run_ended "$W" "$BUSY" || [ "$(date +%s)" -ge "$end" ]; do sleep 5; done
echo "status: $(cat "$W/status" 2>/dev/null)"
cat "$W/times.txt" 2>/dev/null
grep -hE "Finished in state|failed|error:|gs1:" "$W/inprocess.log" "$W/dispatch.log" 2>/dev/null | tail -8
if run_ended "$W" "$BUSY"; then
  tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read status times.txt parts model_sha.txt gpu.txt gpu_samples.csv \
    compile_from.txt 2>/dev/null
  grep -q all-done "$W/status" && pack_compile_cache "$W" "$OUT"
fi
ls -la "$OUT"
