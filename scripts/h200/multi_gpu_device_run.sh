#!/bin/bash
# Issue 52 on a host of several GPUs (nvidia-h200-x2 or x4), started with `setsid nohup` from the
# device checkout's root once the wheels are in /tmp/site and the model pieces (q.00..q.18) in
# /root/m (carry [".data", ".tree_commit"]); not yet run (the kinds are withheld):
#   part "inprocess": ${UNITS_SPEC:-results/h200-engine/spec_24units.json} (3 arms x 8 seeds, 4 steps,
#                     eval on 128 items) in one `gs1 run`, every GPU visible: the engine puts one base
#                     on each GPU and a seed's units on one of them (`LocalServiceClient.place`);
#   part "dispatch":  the same units through `gs1 run --dispatch gs1-arm-unit/train-and-eval
#                     --dispatch-groups N`: a Prefect server on loopback, the units deployment
#                     (deployments/units.yaml) on a `process` pool, and N workers, one a GPU
#                     (CUDA_VISIBLE_DEVICES=k, --limit 1), each flow run a group of whole seeds
#                     trained side by side on its GPU's one base.
#   GPUS:             how many GPUs the dispatch part uses (default: all nvidia-smi lists).
# W/gpu_samples.csv holds every GPU's memory and utilisation every 2 s (its index column says which);
# W/<part>.log each run's log, W/<part>/ its run directory, W/dispatch/worker-K.log each worker's.
# Afterwards: `benchmarks/unit_steps.py W/<part>` (a step of all units, and one table a device) and
# results/h200-multi-gpu/README.md's plan. NVLink multicast stays off in every process (device_env).
#   PARTS=inprocess,dispatch setsid nohup bash scripts/h200/multi_gpu_device_run.sh > /root/run.out 2>&1 < /dev/null &
#   WAIT=540 bash scripts/h200/multi_gpu_device_poll.sh      # in the same call, then again
set -u
W=${GS1_DEVICE_WORK:-/root/work}; mkdir -p "$W"
M=${GS1_DEVICE_MODELS:-/root/m}
DATA=${GS1_DEVICE_DATA:-/root/data}
PARTS=${PARTS:-inprocess,dispatch}
PY=${GS1_DEVICE_PYTHON:-python3}
SPEC=${UNITS_SPEC:-results/h200-engine/spec_24units.json}
PORT=${GS1_DEVICE_PREFECT_PORT:-4210}
. "$(dirname "$0")/device_lib.sh"
device_env "$W"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }
stamp() { echo "$1 $(date +%s.%N)" >> "$W/times.txt"; }
start_run "$W" "$M" "$DATA" "${GS1_DEVICE_MODEL_SUMS:-$PWD/scripts/h200/model_pieces.sha256}" || exit 1
unpack_compile_cache "$W" "${COMPILE_FROM:-}"
record_device "$W"
sample_gpu "$W"
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)}

if has_part inprocess; then
  echo "running inprocess" > "$W/status"; stamp inprocess-start
  $PY -m gs1 run "$SPEC" --run-dir "$W/inprocess" --data-dir "$DATA/gsm8k" > "$W/inprocess.log" 2>&1
  echo "inprocess-rc $?" >> "$W/times.txt"; stamp inprocess-end
  echo inprocess-done >> "$W/parts"
fi

if has_part dispatch; then
  echo "running dispatch" > "$W/status"; stamp dispatch-start; D=$W/dispatch; mkdir -p "$D"
  export PREFECT_API_URL=http://127.0.0.1:$PORT/api PREFECT_WORKER_QUERY_SECONDS=2 PREFECT_WORKER_PREFETCH_SECONDS=2
  $PY -m prefect server start --host 127.0.0.1 --port "$PORT" > "$D/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 60); do $PY -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null && break; sleep 2; done
  $PY -m prefect work-pool create gs1-units --type process > "$D/deploy.log" 2>&1
  $PY -m prefect deploy --prefect-file deployments/units.yaml --all >> "$D/deploy.log" 2>&1
  WORKERS=()
  for k in $(seq 0 $(( GPUS - 1 ))); do
    CUDA_VISIBLE_DEVICES=$k $PY -m prefect worker start --pool gs1-units --type process --limit 1 --name "gpu-$k" \
      > "$D/worker-$k.log" 2>&1 &
    WORKERS+=($!)
  done
  stamp dispatch-workers-up
  $PY -m gs1 run "$SPEC" --dispatch gs1-arm-unit/train-and-eval --dispatch-groups "$GPUS" --run-dir "$D/run" \
    --data-dir "$DATA/gsm8k" > "$W/dispatch.log" 2>&1
  echo "dispatch-rc $?" >> "$W/times.txt"; stamp dispatch-end
  kill "${WORKERS[@]}" 2>/dev/null; wait "${WORKERS[@]}" 2>/dev/null
  kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
  echo dispatch-done >> "$W/parts"
fi
kill $SMI 2>/dev/null
echo "all-done" > "$W/status"
