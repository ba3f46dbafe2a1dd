#!/bin/bash
# Waits up to ${WAIT:-560} s for issue23_device_run.sh to finish, then packs what it wrote so far
# (no weights, caches or compiled kernels) into $OUT: work.tgz, plus the text files on their own.
W=/root/work
end=$(( $(date +%s) + ${WAIT:-560} ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -q all-done "$W/status" 2>/dev/null; do sleep 5; done
cat "$W/status" 2>/dev/null
tail -4 "$W/flow.log" "$W/comparison.log" "$W/warm.log" "$W"/learner_compile_*.txt "$W"/learner_tf32_*.txt "$W/clients.txt" "$W/adapters.txt" "$W/peer.txt" 2>/dev/null
if [ -n "${OUT:-}" ]; then
  tar -C "$W" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.gguf' --exclude='compile*' --exclude='models*' \
      --exclude='cache' -czf "$OUT/work.tgz" . 2>/dev/null
  tar -C "$W" -czf "$OUT/texts.tgz" $(cd "$W" && ls *.txt *.log status 2>/dev/null)
  ls -la "$OUT"
fi
