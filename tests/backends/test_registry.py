from __future__ import annotations

import subprocess
import sys

import pytest

from livemeet.backends import BACKENDS, create_backend, register_backend
from livemeet.backends.scripted import ScriptedCore
from livemeet.config import ModelConfig
from livemeet.errors import ConfigError


def test_scripted_by_name() -> None:
    core = create_backend(ModelConfig(backend="scripted"))
    assert isinstance(core, ScriptedCore) and core.info.name == "scripted"


def test_no_model_selects_demo() -> None:
    assert ModelConfig().backend_name == "demo"
    assert BACKENDS["demo"] == "livemeet.backends.demo:create_demo"


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="scripted"):
        create_backend(ModelConfig(backend="nope"))


def test_unimportable_backend_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "ghost", "livemeet.backends.no_such_module:create")
    with pytest.raises(ConfigError, match="ghost"):
        create_backend(ModelConfig(backend="ghost"))


def test_register_a_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("livemeet.backends.BACKENDS", dict(BACKENDS))
    core = ScriptedCore()
    register_backend("mine", lambda config: core)
    assert create_backend(ModelConfig(backend="mine")) is core


def test_gateway_imports_stay_light() -> None:
    code = (
        "import sys, livemeet.backends, livemeet.gateway.engine_client;"
        "bad = [m for m in ('torch', 'faster_whisper', 'ctranslate2') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
