#!/bin/bash
# Decode before (main) / after (this branch) at the spec shape on the 0.6B config, and one
# full sample + train round on the 1.5B config (sampler's static cache alive during training).
# Logs go to $OUT (kept in results/issue13-memory/logs/: decode_*.log, sample_train_1p5b_after.log).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wt-engine/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
SPEC="--batch 64 --new-tokens 512 --prompt-tokens 160 --rank 32 --device cuda"
timeout 170 python3 benchmarks/engine_speed.py --config qwen3-0.6b $SPEC --skip-train 2>&1 | tee $OUT/decode_before.log
(cd .wt-engine && timeout 190 python3 benchmarks/engine_speed.py --config qwen3-0.6b $SPEC) 2>&1 | tee $OUT/decode_after.log
(cd .wt-engine && timeout 200 python3 benchmarks/engine_speed.py --config qwen2.5-1.5b $SPEC --repeats 1) 2>&1 | tee $OUT/sample_train_1p5b_after.log
