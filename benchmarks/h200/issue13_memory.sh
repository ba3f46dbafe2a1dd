#!/bin/bash
# Run from the device checkout's root (= main) with .wt-engine/ carried: main's code "before",
# .wt-engine's "after". Logs go to $OUT (kept in results/issue13-memory/logs/: mem_*.log, gpu.txt).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wt-engine/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
SPEC="--batch 64 --new-tokens 512 --prompt-tokens 160 --rank 32 --device cuda"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)" | tee -a $OUT/gpu.txt
# 1. memory after (this branch): chunked head + checkpointed layers, then chunked head alone
(cd .wt-engine && timeout 240 python3 benchmarks/engine_speed.py --config qwen2.5-1.5b $SPEC --skip-sample --repeats 2) 2>&1 | tee $OUT/mem_after.log
(cd .wt-engine && timeout 200 python3 benchmarks/engine_speed.py --config qwen2.5-1.5b $SPEC --skip-sample --repeats 1 --gradient-checkpointing off) 2>&1 | tee $OUT/mem_after_no_ckpt.log
# 2. memory before (main's backend, this branch's benchmark script)
cp .wt-engine/benchmarks/engine_speed.py benchmarks/engine_mem.py
timeout 200 python3 benchmarks/engine_mem.py --config qwen2.5-1.5b $SPEC --skip-sample --repeats 1 2>&1 | tee $OUT/mem_before.log
