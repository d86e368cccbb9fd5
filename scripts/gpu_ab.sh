#!/usr/bin/env bash
# A/B of one gpu_bench.sh phase within one device call: the working tree ("new") against an
# older commit ("old", a `git archive` copy beside it), arms run in the order AB_ARMS gives, so
# both see the same loan (loans differ by up to ~6 % in decode-step time; docs/benchmarks.md).
#   AB_OLD=<commit> AB_ARMS="new old new" BENCH_S=110 ... bash scripts/gpu_ab.sh profile
# Where the device copy has no git history, export the old tree here and carry it instead:
#   git archive <commit> livemeet loadtest scripts pyproject.toml | tar -x -C .ab-old
#   (carry [".whl", ".ab-old"]) AB_OLD=<commit> AB_OLD_DIR=.ab-old bash scripts/gpu_ab.sh ...
# Every other variable is passed through to gpu_bench.sh. Arm i writes to $OUT/<i>_<arm>/;
# its summary lines (rates, decode ms per step, step results) are printed as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
phase="${1:?usage: AB_OLD=<commit> bash scripts/gpu_ab.sh <gpu_bench.sh phase>}"
old_rev="${AB_OLD:?AB_OLD must name the commit to compare against}"
OUT="${OUT:-$PWD/bench-out}"
if [ -n "${AB_OLD_DIR:-}" ]; then
  old_dir=$(cd "$AB_OLD_DIR" && pwd)
else
  old_dir=$(mktemp -d)
  git archive "$old_rev" livemeet loadtest scripts pyproject.toml | tar -x -C "$old_dir" \
    || { echo "cannot export $old_rev"; exit 1; }
fi
[ -d .whl ] && [ ! -d "$old_dir/.whl" ] && cp -r .whl "$old_dir/"
i=0
for arm in ${AB_ARMS:-new old}; do
  i=$((i + 1))
  case "$arm" in
    new) dir=$PWD ;;
    old) dir=$old_dir ;;
    *) echo "unknown arm $arm (new or old)"; exit 1 ;;
  esac
  out="$OUT/${i}_$arm"
  mkdir -p "$out"
  if [ "$arm" = new ]; then
    label=$(git rev-parse --short HEAD 2> /dev/null || echo "the working tree")
  else
    label=$old_rev
  fi
  echo "=== arm $i: $arm ($label)"
  (cd "$dir" && OUT="$out" LIVEMEET_BENCH_OUT="$out" bash scripts/gpu_bench.sh "$phase" > /dev/null)
  grep -hE "audio-s/s, p95|^\| (long|short) \||=== .*rc=|passed|failed" "$out/$phase.log" | tail -n 20
done
