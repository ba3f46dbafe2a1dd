#!/bin/bash
# Waits up to ${WAIT:-560} s for issue23_device_run.sh to finish, then packs what it wrote (no
# weights) into $OUT: work.tgz plus the small text files on their own.
W=/root/work
end=$(( $(date +%s) + ${WAIT:-560} ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -q all-done "$W/status" 2>/dev/null; do sleep 5; done
cat "$W/status"; tail -3 "$W"/adapters_*.txt "$W/comparison.log" "$W/peer.txt" "$W/flow.log" 2>/dev/null
if [ -n "${OUT:-}" ]; then
  tar -C "$W" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.gguf' --exclude='compile*' --exclude='models*' \
      --exclude='cache' -czf "$OUT/work.tgz" . 2>/dev/null
  for f in status gpu.txt flow.log adapters_dense.txt adapters_tiled.txt comparison.log peer.txt profile.txt; do [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"; done
  ls -la "$OUT"
fi
