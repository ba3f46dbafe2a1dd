#!/usr/bin/env bash
# Real-server conformance run of the `tinker` backend (not part of CI: ~2 GB of installs and
# minutes of JAX JIT on CPU).
#
# It installs skyrl==0.4.0 (an independently written, open Tinker-API server: `skyrl.tinker.api`
# with its JAX backend) in its own venv, patches it (three patches, each explained below), writes
# a tiny random Qwen3 (tests/fixtures/tiny_model.py), starts the API on 127.0.0.1 with that model,
# runs tests/test_backend_conformance.py and a tiny `gs1 run --backend tinker` against it, and
# stops the server. Results and every remaining difference: docs/tinker-compat.md.
#
# Usage: scripts/tinker_conformance.sh            (from the repository, after the README install)
# Env:   SKYRL_VENV    where the server venv lives  (default .skyrl-venv; reused when present)
#        SKYRL_PYTHON  its interpreter (default python3.12 when there is one: skyrl 0.4.0 declares
#                      Requires-Python >=3.12; else python3.11 with --ignore-requires-python)
#        SKYRL_PORT    the API port on 127.0.0.1     (default 8765)
#        WORK          scratch: model, server db and log, run dir (default a new temp dir)
#        SKYRL_BACKEND_CONFIG  the JAX backend's config (JSON; default below)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
GS1_PY=$REPO/.venv/bin/python
SKYRL_VENV=${SKYRL_VENV:-$REPO/.skyrl-venv}
SKYRL_PYTHON=${SKYRL_PYTHON:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1 || true)}
if [ -z "$SKYRL_PYTHON" ] && python3.12 -V >/dev/null 2>&1; then SKYRL_PYTHON=python3.12; fi
SKYRL_PYTHON=${SKYRL_PYTHON:-python3.11}
SKYRL_PORT=${SKYRL_PORT:-8765}
WORK=${WORK:-$(mktemp -d -t gs1-tinker-conformance.XXXXXX)}
# 8 adapter slots (slot 0 is the base model's: 7 training clients), as the server the issue met;
# small micro-batches and loss chunks, or the JAX backend asks for tens of GB on CPU.
SKYRL_BACKEND_CONFIG=${SKYRL_BACKEND_CONFIG:-'{"max_lora_adapters": 8, "max_lora_rank": 8, "train_micro_batch_size": 1, "sample_max_num_sequences": 16, "loss_chunk_size": 128}'}
mkdir -p "$WORK"
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
[ -x "$GS1_PY" ] || { echo "tinker_conformance: no $GS1_PY; install the project first (README)" >&2; exit 2; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }

# ---- 1. the server venv ------------------------------------------------------------------------
if [ ! -x "$SKYRL_VENV/bin/python" ] || ! "$SKYRL_VENV/bin/python" -c "import skyrl.tinker.api" 2>/dev/null; then
    step "installing skyrl==0.4.0 (tinker + jax extras, JAX on CPU) into $SKYRL_VENV"
    "$SKYRL_PYTHON" -m venv "$SKYRL_VENV"
    # skyrl 0.4.0 declares Requires-Python >=3.12. On 3.11 it needs --ignore-requires-python, and
    # then numpy<2.5 (2.5 builds only on 3.12) and patch 1.
    if "$SKYRL_VENV/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
        "$SKYRL_VENV/bin/pip" install -q --ignore-requires-python "skyrl[tinker,jax]==0.4.0" "jax[cpu]" "numpy<2.5"
    else
        "$SKYRL_VENV/bin/pip" install -q "skyrl[tinker,jax]==0.4.0" "jax[cpu]"
    fi
    # skyrl.tinker.api imports skyrl.tinker.extra, which needs aiohttp, and reads its parent's
    # command line with psutil; neither is in the [tinker] extra.
    "$SKYRL_VENV/bin/pip" install -q aiohttp psutil
fi
SITE=$("$SKYRL_VENV/bin/python" -c "import skyrl, os; print(os.path.dirname(skyrl.__file__))")

# ---- 2. the three patches (idempotent) ---------------------------------------------------------
step "patching skyrl in $SITE"
# Patch 1 (Python < 3.12 only): pydantic refuses a `typing.TypedDict` field type before 3.12
# ("Please use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12"), and
# skyrl/tinker/types.py imports TypedDict from `typing`. Take it from typing_extensions.
"$SKYRL_VENV/bin/python" - "$SITE/tinker/types.py" <<'PY'
import re, sys
if sys.version_info < (3, 12):
    p = sys.argv[1]
    s = open(p).read()
    if "from typing_extensions import TypedDict" not in s:
        line = re.search(r"^from typing import (.*)$", s, re.M)
        names = [n.strip() for n in line.group(1).split(",") if n.strip() and n.strip() != "TypedDict"]
        s = s.replace(line.group(0), f"from typing import {', '.join(names)}\nfrom typing_extensions import TypedDict", 1)
        open(p, "w").write(s)
PY
# Patch 2: SDK 0.38 reads `sample_sequence_ids` from the /asample answer (one id per sample, to
# cancel or track each sequence); skyrl's FutureResponse has no such field, so the SDK fails to
# parse the answer. Return one id per requested sample, as the Tinker service does.
"$SKYRL_VENV/bin/python" - "$SITE/tinker/api.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = '    return FutureResponse(future_id=str(request_id), status="pending", request_id=str(request_id))\n\n\n@app.get("/api/v1/get_server_capabilities"'
new = ('    return FutureResponse(future_id=str(request_id), status="pending", request_id=str(request_id),\n'
       '                          sample_sequence_ids=[f"{request_id}/{j}" for j in range(request.num_samples)])\n\n\n'
       '@app.get("/api/v1/get_server_capabilities"')
if "sample_sequence_ids=[" not in s:
    assert old in s, "patch 2: /asample return not found"
    s = s.replace(old, new, 1)
    field = "class FutureResponse(BaseModel):\n    future_id: str\n    status: str = \"pending\"\n    request_id: str\n"
    assert field in s, "patch 2: FutureResponse not found"
    s = s.replace(field, field + "    sample_sequence_ids: list[str] | None = None\n", 1)
    open(p, "w").write(s)
PY
# Patch 3: the API starts its engine as `uv run <the API's own uv flags> --extra tinker --extra jax
# -m skyrl.tinker.engine ...`, reading those flags from its parent's command line; it must
# therefore itself be started by `uv run ... -m skyrl.tinker.api`. A venv made with pip has no
# uv project, so a small `uv` shim stands in: `uv run [flags] -m MODULE ARGS` runs
# `python -m MODULE ARGS` with the venv's python, as a child (so it is the API's parent).
mkdir -p "$WORK/bin"
cat > "$WORK/bin/uv" <<SH
#!/usr/bin/env bash
# uv shim (tinker_conformance.sh patch 3): drop "run" and uv's own flags, keep "-m MODULE ARGS".
[ "\${1:-}" = run ] && shift
while [ \$# -gt 0 ] && [ "\$1" != -m ]; do shift; done
"$SKYRL_VENV/bin/python" "\$@" &
child=\$!
trap 'kill -TERM \$child 2>/dev/null' TERM INT
wait \$child
SH
chmod +x "$WORK/bin/uv"

# ---- 3. a tiny model ---------------------------------------------------------------------------
MODEL=$WORK/tiny-qwen3
if [ ! -f "$MODEL/config.json" ]; then
    step "writing a tiny random Qwen3 to $MODEL"
    (cd tests && "$GS1_PY" -c "import sys; from fixtures.tiny_model import build_tiny_qwen3; build_tiny_qwen3(sys.argv[1])" "$MODEL")
fi

# ---- 4. the server -----------------------------------------------------------------------------
LOG=$WORK/skyrl-api.log
step "starting skyrl.tinker.api on 127.0.0.1:$SKYRL_PORT (log: $LOG)"
# setsid: the shim leads a process group of its own (the API and its engine inside), which
# stop_server ends as a whole.
PATH="$WORK/bin:$PATH" JAX_PLATFORMS=cpu setsid "$WORK/bin/uv" run -m skyrl.tinker.api \
    --host 127.0.0.1 --port "$SKYRL_PORT" --base-model "$MODEL" --backend jax \
    --database-url "sqlite:///$WORK/tinker.db" --checkpoints-base "$WORK/checkpoints" \
    --backend-config "$SKYRL_BACKEND_CONFIG" \
    >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        step "stopping the server"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 10); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
}
trap stop_server EXIT
export TINKER_BASE_URL=http://127.0.0.1:$SKYRL_PORT TINKER_API_KEY=tml-conformance-local TINKER_BASE_MODEL=$MODEL
for _ in $(seq 1 300); do
    curl -fsS "$TINKER_BASE_URL/api/v1/healthz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "tinker_conformance: the server exited; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
    sleep 1
done
curl -fsS "$TINKER_BASE_URL/api/v1/healthz" >/dev/null || { echo "tinker_conformance: no healthz after 300 s; see $LOG" >&2; exit 1; }
step "server up"

# ---- 5. the conformance suite and a tiny run ---------------------------------------------------
status=0
step "pytest tests/test_backend_conformance.py -k tinker"
"$REPO/.venv/bin/pytest" -q -p no:cacheprovider tests/test_backend_conformance.py -k tinker -rA 2>&1 | tee "$WORK/conformance.txt" || status=1
step "gs1 run --backend tinker (tiny)"
"$GS1_PY" - "$MODEL" "$WORK/spec.json" <<'PY'
# The demo spec at a tiny scale on the tiny random model. Its activation bounds are opened (a
# random model earns ~no reward): this run checks the backend's calls end to end, not the method.
import json, sys
spec = json.load(open("specs/demo_local.json"))
spec.update(title="tinker conformance (tiny)", base_model=sys.argv[1], base_model_path=None, renderer="qwen3_instruct",
            steps=2, batch_size=16, lora_rank=4, sampling={"max_tokens": 4, "temperature": 1.0},
            pilot={"steps": 2, "heldout_prompts": 4, "heldout_samples": 2})
spec["arms"][0].update(groups_per_batch=2)
spec["arms"][1].update(groups_per_batch=16)
spec["arms"][1]["kernel"]["window"] = 64
spec["dataset"]["n_examples"] = 64
spec["eval"]["n_examples"] = spec["dataset"]["options"]["n_test"] = 16
spec["feasibility"]["effective_config"] = None
spec["budget"] = {"gpu_hours": 10.0, "max_wall_minutes": 600}  # JAX on 2 shared CPU cores is slow
# A random model earns no reward, so a reward correlation is not computable: that check is left out.
spec["activation_gate"]["checks"] = [c for c in spec["activation_gate"]["checks"] if c["metric"] != "baseline_reward_corr"]
for check in spec["activation_gate"]["checks"]:
    if "min" in check:
        check["min"] = -1.0 if check["metric"] == "baseline_reward_corr" else 0.0
    if "max" in check:
        check["max"] = 1.0
json.dump(spec, open(sys.argv[2], "w"), indent=1)
PY
"$REPO/.venv/bin/gs1" validate "$WORK/spec.json"
"$REPO/.venv/bin/gs1" run "$WORK/spec.json" --backend tinker --run-dir "$WORK/run" 2>&1 | tee "$WORK/gs1-run.txt"
gs1_status=${PIPESTATUS[0]}
echo "gs1 run exit: $gs1_status" | tee -a "$WORK/gs1-run.txt"
[ "$gs1_status" = 0 ] || status=1
step "done: $WORK (conformance.txt, gs1-run.txt, skyrl-api.log)"
exit $status
