# Shared steps of the device run scripts (comparison_device_units.sh, geff_device_run.sh), sourced
# by them; tests/test_device_scripts.py runs each on made-up folders.

# device_env W: what every device run exports: imports from the wheels (/tmp/site) and the
# checkout, no telemetry, no hub, no NVLink multicast, the engine's caches under W, and inductor's cache named
# outright too (the engine pins GS1_COMPILE_CACHE for inductor itself, engine
# pin_compile_cache; naming it here covers any torch process the scripts start)
device_env() {
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
  # NVLink multicast off in every process a script starts (a host of several GPUs sets these; a
  # program that used it could put the host's shared GPUs out of service: the device notes)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export GS1_LOCAL_CACHE=$1/cache GS1_COMPILE_CACHE=$1/compile GS1_MODEL_CACHE=$1/models TORCHINDUCTOR_CACHE_DIR=$1/compile
}

# start_run W MODELS DATA SUMS: status "assembling", the carried GSM8K copied into DATA, the
# policy's pieces in MODELS assembled into model.gguf and checked against SUMS (assemble_pieces,
# W/model_sha.txt). A failed check sets the status to "model checksum failed" and returns 1.
start_run() {
  local w=$1 models=$2 data=$3 sums=$4
  echo assembling > "$w/status"
  mkdir -p "$data" && cp -r .data/gsm8k "$data/" 2>/dev/null
  if ! assemble_pieces "$models" q model.gguf "$sums" "$w/model_sha.txt"; then
    echo "model checksum failed" > "$w/status"; return 1
  fi
}

# sample_gpu W: GPU memory and utilisation every 2 s into W/gpu_samples.csv, in the background;
# SMI holds the sampler's pid (kill it when the run ends)
sample_gpu() {
  nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 2000 > "$1/gpu_samples.csv" 2>/dev/null &
  SMI=$!
}

# assemble_pieces DIR PREFIX TARGET SUMS LOG: cat DIR/PREFIX.* into DIR/TARGET (unless it is there)
# and check it against TARGET's line in SUMS (a committed sha256 file, one line per piece and one
# for the whole). Pass: the pieces go, LOG says "TARGET: OK". Fail: the pieces stay, LOG names the
# damaged piece (each piece's check), the folder and the disk, the assembled file goes; returns 1.
assemble_pieces() {
  local dir=$1 prefix=$2 target=$3 sums=$4 log=$5
  if [ ! -s "$dir/$target" ]; then cat "$dir/$prefix".* > "$dir/$target" 2>/dev/null; fi
  if (cd "$dir" && grep " $target\$" "$sums" | sha256sum -c -) > "$log" 2>&1; then
    rm -f "$dir/$prefix".*
    return 0
  fi
  { ls -la "$dir"; (cd "$dir" && grep " $prefix\.[0-9]*\$" "$sums" | sha256sum -c -); df -h "$dir"; } >> "$log" 2>&1
  rm -f "$dir/$target"
  return 1
}

# unpack_compile_cache W FROM: inductor's cache from FROM/compile.tgz.NN (an earlier session's
# poll brought them back) into W/compile, when FROM is set and W/compile is empty. Call it before
# anything imports torch: an import may make W/compile, and session 13's check for the folder
# read that as "already unpacked". Writes W/compile_from.txt either way.
unpack_compile_cache() {
  local w=$1 from=${2:-}
  if [ -n "$from" ] && [ -z "$(ls -A "$w/compile" 2>/dev/null)" ] && ls "$from"/compile.tgz.?? > /dev/null 2>&1; then
    cat "$from"/compile.tgz.?? | tar xzf - -C "$w" && echo "compile cache: $(du -sh "$w/compile" | cut -f1) from $from" > "$w/compile_from.txt"
  fi
  [ -s "$w/compile_from.txt" ] || echo "compile cache: none unpacked (COMPILE_FROM=$from, pieces: $(ls "${from:-.compile}" 2>&1 | tr '\n' ' '), $w/compile: $(ls -A "$w/compile" 2>/dev/null | wc -l) entries)" > "$w/compile_from.txt"
}

# record_device W: the GPU, the versions and the tree that ran, into W/gpu.txt (the device copy's
# .git is stale: .tree_commit, carried, names the commit)
record_device() {
  local w=$1
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$w/gpu.txt" 2>&1
  python3 -c 'import torch, transformers, peft, prefect, tinker; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__, "peft", peft.__version__, "prefect", prefect.__version__, "tinker", tinker.__version__)' >> "$w/gpu.txt" 2>&1
  cat .tree_commit >> "$w/gpu.txt" 2>/dev/null
}

# run_ended W BUSY: W/status is there and names neither of BUSY's states (an extended regex such
# as "assembling|running"): all-done, or a failure at the start, which must not hold the call
run_ended() { [ -f "$1/status" ] && ! grep -qE "^($2)" "$1/status"; }

# wait_for_run W BUSY WAIT: sleeps until run_ended or WAIT seconds have passed, then prints the status
wait_for_run() {
  local end=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$end" ] && ! run_ended "$1" "$2"; do sleep 5; done
  echo "status: $(cat "$1/status" 2>/dev/null)"
}

# pack_compile_cache W OUT: inductor's cache (W/compile) into OUT in 15 MB pieces
# (compile.tgz.NN, for the next session's COMPILE_FROM) when they fit in the files left of the 8
# that come back; else says so and leaves it
pack_compile_cache() {
  local w=$1 out=$2 pieces left
  [ -d "$w/compile" ] || return 0
  tar cf - -C "$w" compile | gzip -1 > "$w/compile.tgz"
  pieces=$(( ($(stat -c %s "$w/compile.tgz") + 14999999) / 15000000 )); left=$(( 8 - $(ls "$out" | wc -l) ))
  if [ "$pieces" -le "$left" ]; then split -b 15000000 -d -a 2 "$w/compile.tgz" "$out/compile.tgz."
  else echo "compile cache: $pieces pieces of 15 MB, $left files left to bring back: left on the machine"; fi
}

# pack_part W OUT PART: W/PART (and W/PART.log) without weights into OUT/PART.tgz.NN, 15 MB pieces
# (a piece over 16 MiB would not come back; `cat PART.tgz.* | tar xz` joins them), once (W/PART.packed)
pack_part() {
  local w=$1 out=$2 part=$3
  [ -f "$w/$part.packed" ] && return 0
  tar czf - -C "$w" --exclude='*.safetensors' --exclude='*.pt' --ignore-failed-read "$part" "$part.log" 2>/dev/null \
    | split -b 15000000 -d -a 2 - "$out/$part.tgz." && touch "$w/$part.packed"
}
