#!/usr/bin/env bash
# Creates ./.venv and installs livemeet into it with the given extras (default: demo).
#   bash scripts/setup.sh [demo,test]
# torch: a CUDA build is several GB, so on a machine without an NVIDIA driver we ask for the CPU
# build explicitly. A torch >= 2.11 already in .venv is kept (a second run skips the download).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-demo}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)
# pip install -q, minus the warnings pip prints for configured index locations that do not
# exist on this machine, and setuptools' "Editable installation ... be careful with folders in
# your working directory" notice (nine lines on every setup, a new user's trial: it is
# informational, and filtered by its message only); pip's own exit status is kept (a failed
# install must fail setup).
pip_install() {
  set +e
  PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
    "${pip[@]}" install -q "$@" 2>&1 | grep -v "is ignored: it is neither"
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}
"${pip[@]}" install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c 'import torch, sys; sys.exit(0 if tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])) >= (2, 11) else 1)' 2>/dev/null; then
  if ls /opt/wheels/torch-2.13.0* >/dev/null 2>&1 || command -v nvidia-smi >/dev/null 2>&1; then
    pip_install "torch==2.13.0"
  else
    pip_install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip_install -e ".[${extras}]"
.venv/bin/python -c 'import livemeet' || { echo "livemeet failed to install" >&2; exit 1; }
