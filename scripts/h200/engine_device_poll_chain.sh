#!/bin/bash
# Polls engine_device_run.sh runs started back to back in one chain (each with its own
# GS1_DEVICE_WORK), in order, up to ${WAIT:-540} s in all: each folder's files come back under
# $OUT/<folder's name> by engine_device_poll.sh, once its run has ended; a folder already brought
# back (W.polled) is skipped, so the next call goes on where this one stopped. Inductor's cache
# comes back only from the chain's last folder (earlier ones would take the 8 files a call brings).
#   WAIT=540 bash scripts/h200/engine_device_poll_chain.sh /root/work /root/work2 /root/work3
BUSY="assembling|running"
. "$(dirname "$0")/device_lib.sh"
end=$(( $(date +%s) + ${WAIT:-540} ))
last=${!#}
for w in "$@"; do
  [ -f "$w.polled" ] && continue
  # a folder's run has not started while the one before it runs: wait for its status
  while [ ! -s "$w/status" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  left=$(( end - $(date +%s) ))
  [ "$left" -gt 0 ] || { echo "$w: not started within the wait"; break; }
  mkdir -p "$OUT/$(basename "$w")"
  OUT="$OUT/$(basename "$w")" GS1_DEVICE_WORK="$w" WAIT=$left NO_COMPILE_PACK=$([ "$w" = "$last" ] || echo 1) \
    bash "$(dirname "$0")/engine_device_poll.sh"
  run_ended "$w" "$BUSY" && touch "$w.polled" || break
done
