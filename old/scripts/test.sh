#!/usr/bin/env bash
# Installs livemeet with its test extras into ./.venv, runs the linters, then the test suite.
# pytest exit code 5 ("no tests collected") is treated as a failure: an empty run proves nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "demo,test"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
bash scripts/lint.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
