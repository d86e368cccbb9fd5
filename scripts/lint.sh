#!/usr/bin/env bash
# ruff over everything; mypy --strict over the policy, protocol and I/O-edge modules
# (pyproject.toml [tool.mypy] lists them). Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check livemeet tests loadtest scripts
.venv/bin/mypy --no-error-summary --follow-imports=silent livemeet/gateway livemeet/session livemeet/transcript \
  livemeet/engine/block_manager.py livemeet/engine/scheduler.py livemeet/engine/request.py \
  livemeet/engine/cost_model.py livemeet/engine/worker.py livemeet/engine/shared_audio.py \
  livemeet/engine/channel.py livemeet/models/prompt.py \
  livemeet/engine/staging.py \
  livemeet/engine/prefill_graph.py livemeet/engine/cuda_graph.py livemeet/backends livemeet/eval \
  livemeet/cli livemeet/audio/decode.py livemeet/audio/gapless.py livemeet/audio/joined.py \
  livemeet/audio/pcm.py livemeet/errors.py \
  livemeet/config.py livemeet/transcriber.py
