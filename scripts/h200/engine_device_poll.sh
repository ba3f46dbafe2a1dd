#!/bin/bash
# Waits up to ${WAIT:-560} s for engine_device_run.sh and prints where it is. A part is packed into
# $OUT in the call that first sees it done (W/parts), once: units.tgz.NN (the 24-unit run directory
# without weights: gates, train and eval logs, decision, .stage-results) and repro.tgz.NN (the
# reproduction's run folders without weights, their logs and comparisons) and speed.tgz.NN (the
# multi-adapter table and the engine's log) and learner.tgz.NN (the learner's table and log under
# each setting) and agree.tgz.NN (the LoRA paths' gradient agreement) and e2e.tgz.NN (the cold
# and warm runs without weights, their logs and stage tables); until the speed part is done, every call brings back
# its table as far as it got (speed-so-far.txt). Once the run has ended,
# logs.tgz (status, times, logs, GPU samples, versions) and inductor's cache in pieces
# (compile.tgz.NN) when they fit; FINAL=1 (a session's last call) packs the parts and logs as they
# stand even though the run goes on. A run that stopped short (e.g. "model checksum failed") ends the
# wait at once and brings back what it wrote of its start (tests/test_device_scripts.py).
W=${GS1_DEVICE_WORK:-/root/work}  # the device run's folder (a test points it elsewhere)
BUSY="assembling|running"
. "$(dirname "$0")/device_lib.sh"

pack() { pack_part "$W" "$OUT" "$1"; }

pack_parts() {
  [ -n "${OUT:-}" ] || return 0
  grep -qx units-done "$W/parts" 2>/dev/null && pack units
  grep -qx repro-done "$W/parts" 2>/dev/null && pack repro
  grep -qx speed-done "$W/parts" 2>/dev/null && pack speed && rm -f "$OUT/speed-so-far.txt"
  grep -qx learner-done "$W/parts" 2>/dev/null && pack learner
  grep -qx agree-done "$W/parts" 2>/dev/null && pack agree
  grep -qx e2e-done "$W/parts" 2>/dev/null && pack e2e
  # the speed table as far as it got (a few kB), kept fresh while it runs: a session may end first
  if [ -s "$W/speed/adapters.txt" ] && ! [ -f "$W/speed.packed" ]; then cp "$W/speed/adapters.txt" "$OUT/speed-so-far.txt"; fi
}

end=$(( $(date +%s) + ${WAIT:-560} ))
while :; do
  pack_parts
  if run_ended "$W" "$BUSY" || [ "$(date +%s)" -ge "$end" ]; then break; fi
  sleep 5
done
pack_parts
echo "status: $(cat "$W/status" 2>/dev/null)"
cat "$W/times.txt" 2>/dev/null
grep -hE "Finished in state|failed|Error|error:|gs1:|step [0-9]+/" "$W/units.log" 2>/dev/null | tail -8
tail -3 "$W"/repro/*.log 2>/dev/null
grep -h "adapters:" "$W/speed/adapters.txt" 2>/dev/null
grep -H "^| train |" "$W"/learner/*.txt 2>/dev/null
grep -h "^| " "$W/agree/agreement.txt" 2>/dev/null
tail -n 3 "$W"/e2e/*-stages.txt 2>/dev/null
[ -n "${OUT:-}" ] || exit 0
# FINAL=1 (the session's last call): what the parts wrote so far comes back even though the run goes on
if [ -n "${FINAL:-}" ] && ! run_ended "$W" "$BUSY"; then
  for part in units repro learner agree e2e; do [ -d "$W/$part" ] && pack "$part"; done
fi
if run_ended "$W" "$BUSY" || [ -n "${FINAL:-}" ]; then
  tar czf "$OUT/logs.tgz" -C "$W" --ignore-failed-read status times.txt parts model_sha.txt gpu.txt gpu_samples.csv \
    compile_from.txt units.log 2>/dev/null
  # NO_COMPILE_PACK=1: not this folder's (a chain's earlier run, engine_device_poll_chain.sh)
  grep -q all-done "$W/status" && [ -z "${NO_COMPILE_PACK:-}" ] && pack_compile_cache "$W" "$OUT"
fi
ls -la "$OUT"
