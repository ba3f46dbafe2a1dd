#!/bin/bash
# Primes the next session's comparison run when a session has too little device time left for a
# unit: starts comparison_device_units.sh (UNITS as it will run), waits until the gates are done
# and the learner has compiled (or ${WAIT:-420} s pass), stops the run with SIGTERM (it stays
# resumable), and packs into $OUT what the next session carries back:
#   run-gates.tgz        the run directory without train/ and eval/ (the gates' records and
#                        .stage-results: the gates come back Cached while rl/, schemas/ and the
#                        stage tasks' sources are unchanged)
#   compile.tgz.NN       inductor's cache (GS1_COMPILE_CACHE), in pieces of 15 MB
#   logs.tgz             the flow's log, gpu.txt, model_sha.txt, GPU memory samples
# Usage, in one device call after the setup calls:
#   UNITS=... WAIT=420 bash scripts/h200/comparison_device_prime.sh
W=/root/work
: "${UNITS:?name the units, e.g. UNITS=grpo_gs8-s0,gs1_kernel-s0}"
UNITS=$UNITS setsid nohup bash scripts/h200/comparison_device_units.sh > /root/run.out 2>&1 < /dev/null &
end=$(( $(date +%s) + ${WAIT:-420} ))
sleep 5
while [ "$(date +%s)" -lt "$end" ] && ! grep -q "all-done" "$W/status" 2>/dev/null \
      && ! grep -q "learner: decoder layers compiled" "$W/flow.log" 2>/dev/null; do sleep 3; done
sleep ${SETTLE:-8}  # a recompile often follows the first compile within seconds
pkill -TERM -f "gs1 run" ; sleep 6; pkill -KILL -f "gs1 run"
echo "status: $(cat "$W/status" 2>/dev/null)"
grep -E "Finished in state|compiled|failed|gs1:" "$W/flow.log" 2>/dev/null | tail -14
[ -n "${OUT:-}" ] || exit 0
(cd "$W/run" && tar czf "$OUT/run-gates.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='./train' --exclude='./eval' .)
# nothing compiled before the run stopped: no cache to bring
[ -d "$W/compile" ] && (cd "$W" && tar czf - compile | split -b 15000000 -d -a 2 - "$OUT/compile.tgz." && du -sh compile)
(cd "$W" && tar czf "$OUT/logs.tgz" flow.log gpu.txt gpu_samples.csv model_sha.txt status 2>/dev/null)
ls -la "$OUT"
