"""Engine tests reuse the tiny MOSS-TD checkpoint fixtures of tests/models."""

from tests.models.conftest import (  # noqa: F401  (re-exported fixtures)
    clips,
    hf_dir,
    long_speech,
    our_model,
    ref_model,
    tiny_weights,
    upstream_dir,
)
