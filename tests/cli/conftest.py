"""CLI tests of the MOSS-TD backend reuse the tiny checkpoint fixtures of tests/models."""

from tests.models.conftest import tiny_weights, upstream_dir  # noqa: F401  (re-exported)
