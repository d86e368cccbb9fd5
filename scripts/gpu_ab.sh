#!/usr/bin/env bash
# A/B of one gpu_bench.sh phase within one device call: the working tree ("new") against an
# older commit ("old", a `git archive` copy beside it), arms run in the order AB_ARMS gives, so
# both see the same loan (loans differ by up to ~6 % in decode-step time; docs/benchmarks.md).
#   AB_OLD=<commit> AB_ARMS="new old new" BENCH_S=110 ... bash scripts/gpu_ab.sh profile
# Where the device copy has no git history, export the old tree here and carry it instead:
#   git archive <commit> livemeet loadtest scripts pyproject.toml | tar -x -C .ab-old
#   (carry [".whl", ".ab-old"]) AB_OLD=<commit> AB_OLD_DIR=.ab-old bash scripts/gpu_ab.sh ...
# An "env" arm runs the working tree with AB_ENV's assignments exported (a switch read at
# import, e.g. AB_ENV="LIVEMEET_QKV_ROPE=0" AB_ARMS="new env new"); AB_OLD is then unused.
# Every other variable is passed through to gpu_bench.sh (GPU_BENCH replaces it, as in gpu_next.sh). Arm i writes to $OUT/<i>_<arm>/;
# its summary lines (rates, decode ms per step, step results) are printed as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
phase="${1:?usage: AB_OLD=<commit> bash scripts/gpu_ab.sh <gpu_bench.sh phase>}"
arms="${AB_ARMS:-new old}"
OUT="${OUT:-$PWD/bench-out}"
if [[ " $arms " != *" old "* ]]; then
  old_rev=none old_dir=$PWD
elif [ -z "${AB_OLD:-}" ]; then
  echo "AB_OLD must name the commit to compare against"; exit 2
elif [ -n "${AB_OLD_DIR:-}" ]; then
  old_rev=$AB_OLD
  old_dir=$(cd "$AB_OLD_DIR" && pwd)
else
  old_rev=$AB_OLD old_dir=$(mktemp -d)
  git archive "$old_rev" livemeet loadtest scripts pyproject.toml | tar -x -C "$old_dir" \
    || { echo "cannot export $old_rev"; exit 1; }
fi
[ -d .whl ] && [ ! -d "$old_dir/.whl" ] && cp -r .whl "$old_dir/"
i=0
for arm in $arms; do
  i=$((i + 1))
  env_args=()
  case "$arm" in
    new) dir=$PWD ;;
    old) dir=$old_dir ;;
    env) dir=$PWD; read -r -a env_args <<< "${AB_ENV:?an env arm needs AB_ENV}" ;;
    *) echo "unknown arm $arm (new, old or env)"; exit 1 ;;
  esac
  out="$OUT/${i}_$arm"
  mkdir -p "$out"
  if [ "$arm" != old ]; then
    label=$(git rev-parse --short HEAD 2> /dev/null || echo "the working tree")
    # a device copy may carry an older .git than its files (session 37's arms said f2c6714
    # for bee46f7): say so where the tracked files differ from that commit
    git diff --quiet HEAD -- 2> /dev/null || label="$label with local changes"
    [ "$arm" = env ] && label="$label with ${AB_ENV}"
  else
    label=$old_rev
  fi
  echo "=== arm $i: $arm ($label)"
  (cd "$dir" && env ${env_args[@]+"${env_args[@]}"} OUT="$out" LIVEMEET_BENCH_OUT="$out" \
    bash "${GPU_BENCH:-scripts/gpu_bench.sh}" "$phase" > /dev/null)
  # an engine run's rates and table, a profile's decode rows, and every step's status
  grep -hE "audio-s/s, p95|^\| (long|short) \||^batch +[0-9]+ context|=== .*rc=|passed|failed" \
    "$out/$phase.log" | tail -n 20
done
