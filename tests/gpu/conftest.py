"""GPU parity tests reuse the real-speech and tiny-checkpoint fixtures of tests/models."""

from tests.models.conftest import (  # noqa: F401  (re-exported fixtures)
    hf_dir,
    long_speech,
    our_model,
    ref_model,
    tiny_weights,
    upstream_dir,
)
