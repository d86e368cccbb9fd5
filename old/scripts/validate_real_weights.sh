#!/usr/bin/env bash
# Validate livemeet on a real MOSS-TD checkpoint: parity, offline quality, live vs offline.
# Usage: scripts/validate_real_weights.sh [CHECKPOINT_DIR] [--out DIR] [--speed X]
# (CHECKPOINT_DIR defaults to $MOSS_TD_CHECKPOINT; exits 2 without one). PYTHON picks the
# interpreter (default: the repository's .venv, else python3).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$repo/scripts/validate_real_weights.py" "$@"
