"""Backend registry: `create_backend(config)` builds the `BackendCore` named by
`config.backend_name`.

Each entry maps a name to "module:factory", a callable `(ModelConfig) -> BackendCore`; the module
is imported only when that backend is created, so importing this package (as the gateway does)
never imports torch or faster-whisper. Adding a backend is one line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from livemeet.config import ModelConfig
from livemeet.errors import ConfigError

if TYPE_CHECKING:
    from livemeet.backends.base import BackendCore

BackendFactory = Callable[[ModelConfig], "BackendCore"]

BACKENDS: dict[str, str | BackendFactory] = {
    "demo": "livemeet.backends.demo:create_demo",
    "moss": "livemeet.backends.moss:create_moss",
    "scripted": "livemeet.backends.scripted:create_scripted",
}
# registered backends that only tests use (a scripted transcript, no model): still selectable,
# and `--backend`'s help says what they are for
TEST_BACKENDS = frozenset({"scripted"})


def register_backend(name: str, factory: str | BackendFactory) -> None:
    """Register `factory` ("module:attr" or a callable) under `name` (replaces an existing one)."""
    BACKENDS[name] = factory


def check_backend(config: ModelConfig) -> str | BackendFactory:
    """The registry entry of `config.backend_name`. Raises ConfigError for an unknown name."""
    name = config.backend_name
    entry = BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; registered: {', '.join(sorted(BACKENDS))}")
    return entry


def create_backend(config: ModelConfig) -> BackendCore:
    """The backend core for `config` (not yet loaded). Raises ConfigError for an unknown name or
    a backend whose module cannot be imported."""
    name = config.backend_name
    entry = check_backend(config)
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"backend {name!r} cannot be imported: {exc}") from exc
        entry = getattr(module, attr)
    return entry(config)
