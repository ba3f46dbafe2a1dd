#!/bin/bash
# Wait up to $1 seconds for scripts/h200/gsm8k_device_run.sh to finish; print where it is; when it has finished,
# pack what comes back into $OUT (the run directory without weights, the logs).
W=/root/work; T=${1:-560}; t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt "$T" ] && ! grep -q all-done "$W/status" 2>/dev/null; do sleep 5; done
echo "status: $(cat $W/status 2>/dev/null)"; tail -c 1500 "$W/attention_probe.txt" 2>/dev/null | tail -4
grep -E "Finished in state|failed|error|step [0-9]+/" "$W/flow.log" 2>/dev/null | tail -8
grep -q all-done "$W/status" 2>/dev/null || exit 0
cd "$W" && tar czf "$OUT/run.tar.gz" --exclude='*.safetensors' --exclude='optimizer.pt' run \
  && tar czf "$OUT/logs.tar.gz" flow.log warm.log gpu.txt gpu_samples.csv attention_probe.txt model_sha.txt \
  && ls -la "$OUT"
