"""CLI subcommands: argument parsing, transcribe and stream against the fake transcriber."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf
import websockets
from aiohttp import web
from aiohttp.test_utils import TestClient

from livemeet.__main__ import build_parser, main
from livemeet.audio.constants import LIVE_HOP_S
from livemeet.audio.decode import decode_file
from livemeet.cli import live_client, serve, stream, transcribe
from livemeet.config import ModelConfig, ServerConfig
from livemeet.errors import BadAudio, ConfigError, InvalidRequest, QueueFull
from livemeet.gateway.live_protocol import GOING_AWAY
from livemeet.transcript.formats import ResponseFormat
from tests.audio.conftest import (  # noqa: F401  (fixtures)
    EncodedClip,
    encoded_clips,
    id3v2_tag,
    speech,
)
from tests.denied import deny_access
from tests.gateway.conftest import client, fake, server_config  # noqa: F401  (fixtures)
from tests.gateway.fakes import FakeTranscriber, expected_upload_text


def write_wav(path: Path, duration_s: float, rate: int = 16_000) -> Path:
    t = np.arange(int(duration_s * rate)) / rate
    sf.write(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    return path


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_says_what_it_does_and_its_default() -> None:
    """A user trial found stream's file, --url, --language and --prompt, serve's --dtype and
    eval's --metric without help, and defaults (stream's URL, serve's --max-sessions, ...)
    not shown. Every argument of every subcommand has help; every option with a default
    other than none/off names it."""
    parsers = subcommand_parsers()
    assert set(parsers) == {"serve", "transcribe", "stream", "eval", "keys"}
    for name, parser in parsers.items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help.strip(), f"{where}: no help"
            shown = formatter._expand_help(action)  # %(default)s filled in
            if action.option_strings and action.default not in (None, False, []):
                assert "default" in shown, f"{where}: default {action.default!r} not shown"


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"livemeet {version('livemeet')}"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["serve", "--prot", "18401"], "livemeet serve: error: unrecognized arguments: --prot "
         "18401 (did you mean --port?)"),
        (["stream", "--fats", "a.wav"], "livemeet stream: error: unrecognized arguments: --fats "
         "(did you mean --fast?)"),
        (["keys", "create", "--nmae=bob"], "livemeet keys create: error: unrecognized "
         "arguments: --nmae=bob (did you mean --name?)"),
        (["transcribe", "a.wav", "--zzz"], "livemeet transcribe: error: unrecognized "
         "arguments: --zzz"),
    ],
)  # fmt: skip
def test_a_mistyped_option_is_named_by_its_subcommand_with_the_one_meant(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new user's trial: `livemeet serve --prot 18401` was refused by the top-level parser
    (`livemeet: error: unrecognized arguments`, under livemeet's usage, not serve's), with no
    word of --port."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == said
    assert err.startswith(f"usage: livemeet {argv[0]}")


def test_serve_arguments_build_a_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "0", "--data-dir", str(tmp_path), "--max-audio-s", "10"]
    )
    config = serve.config_from_args(args)
    assert config.port == 0 and config.data_dir == tmp_path
    assert config.gateway.max_audio_s == 10 and config.model.backend_name == "demo"
    assert serve.ssl_context(config) is None


def test_serve_live_hop_flag(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--live-hop-s", "0.5"])
    assert serve.config_from_args(args).gateway.live_hop_s == 0.5
    assert build_parser().parse_args(["serve"]).live_hop_s == LIVE_HOP_S
    for bad in ("0", "-1", "60", "nan"):
        with pytest.raises(ConfigError, match="--live-hop-s"):
            serve.config_from_args(build_parser().parse_args(["serve", "--live-hop-s", bad]))


def test_serve_cancels_the_handlers_of_clients_that_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp lets a handler run on after its client disconnected unless told otherwise; the
    upload handler's cleanup (aborting the engine session) needs the cancellation. The GIL
    switch interval is set for the gateway process."""
    import sys

    from livemeet.audio.constants import GIL_SWITCH_INTERVAL_S

    seen: dict[str, Any] = {}
    monkeypatch.setattr(web, "run_app", lambda app, **kw: seen.update(kw))
    before = sys.getswitchinterval()
    try:
        assert main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 0
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)
    assert seen["handler_cancellation"] is True


def test_a_second_stop_signal_says_the_stop_was_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp raises GracefulExit again for a second SIGTERM or SIGINT, which ends its
    cleanup where it is: `serve` exited 1 after a log whose last line was an upload's
    "request cancelled" (a trial), as if it had crashed."""

    def second_signal(app: web.Application, **kw: Any) -> None:
        raise web.GracefulExit

    monkeypatch.setattr(web, "run_app", second_signal)
    caplog.set_level(logging.INFO, "livemeet.serve")
    assert main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 1
    last = caplog.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage().startswith("a second stop signal: stopped at once")


@pytest.mark.parametrize("phase", ["imports", "checks"])
def test_a_stop_signal_during_the_start_stops_it(
    phase: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As PID 1 of a container a SIGTERM without a handler is ignored: one sent while `serve`
    imported its subcommands or checked its configuration (the first second, before
    aiohttp's handlers) was lost, and the server went on to serve until the supervisor's
    SIGKILL (the container trial)."""
    import livemeet.__main__ as entry

    class Unhandled(Exception):
        """What this test's own handler raises: the old code let the signal through."""

    def unhandled(signum: int, frame: object) -> None:
        raise Unhandled

    def must_not_run(*args: object) -> None:
        raise AssertionError("the start went on after the stop signal")

    def signalled(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    if phase == "imports":
        real_build_parser = entry.build_parser

        def signalled_mid_import() -> argparse.ArgumentParser:
            signalled()
            return real_build_parser()

        monkeypatch.setattr(entry, "build_parser", signalled_mid_import)
    else:
        monkeypatch.setattr(serve, "check_data_dir", signalled)
    monkeypatch.setattr("livemeet.gateway.app.create_app", must_not_run)
    before = signal.signal(signal.SIGTERM, unhandled)  # pytest's own process must survive
    try:
        with caplog.at_level("INFO", "livemeet.serve"):
            assert main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 130
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the caller's handler is back
    finally:
        signal.signal(signal.SIGTERM, before)
    if phase == "imports":
        assert capsys.readouterr().err == "livemeet: stopped by a signal before it began\n"
    else:
        assert caplog.records[-1].getMessage() == "livemeet stopped by a signal before it served"


def test_an_engine_that_failed_to_load_exits_2_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A backend whose load met an error no check foresaw (the container trial: a read-only
    /tmp, a cache in an unwritable home) is the worker's internal_error: `serve` added a
    second traceback to the worker's and exited 1, where a model that would not start
    exits 2. Another InternalError of the start (the gateway's own: a bug, with no traceback
    logged) is not said to have one above: it keeps its own (it was one line, tracebackless)."""
    from livemeet.errors import InternalError
    from livemeet.gateway.engine_client import WorkerLoadFailed

    def failed_load(app: web.Application, **kw: Any) -> None:
        raise WorkerLoadFailed("backend failed to load: PermissionError(13, 'Permission denied')")

    monkeypatch.setattr(web, "run_app", failed_load)
    assert main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 2
    last = caplog.records[-1]
    assert last.levelno == logging.ERROR
    assert last.getMessage() == (
        "internal_error: backend failed to load: PermissionError(13, 'Permission denied') "
        "(its traceback is above)"
    )

    def gateway_bug(app: web.Application, **kw: Any) -> None:
        raise InternalError("LiveJournal.start() was called twice")

    monkeypatch.setattr(web, "run_app", gateway_bug)
    with pytest.raises(InternalError, match="called twice"):
        main(["serve", "--port", "0", "--data-dir", str(tmp_path / "second")])


def test_serve_on_a_taken_port_or_unknown_host_exits_2_before_loading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An independent trial got a traceback and exit 1, after the model had loaded, from a
    port in use and from `--host 256.1.1.1`."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, p in (("127.0.0.1", port), ("256.1.1.1", 8000)):
            argv = ["serve", "--host", host, "--port", str(p), "--data-dir", str(tmp_path)]
            with caplog.at_level("ERROR"):
                assert serve.run(build_parser().parse_args(argv)) == 2
            assert f"cannot listen on {host}:{p}" in caplog.text
            # a port in use says what to do (a new user's trial: "Address already in use")
            in_use = "Address already in use (another server holds the port: stop it, or pick"
            assert (in_use in caplog.text) == (host == "127.0.0.1")
            caplog.clear()
    serve.check_listen("127.0.0.1", port)  # free again: no error


def test_check_listen_probes_ipv6_as_asyncio_binds() -> None:
    """IPv6 probes are IPv6-only, as asyncio's sockets: `--host ::` is free while another
    process holds the IPv4 port (a fresh-eyes review found it refused)."""
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            serve.check_listen("::", port)
        except ConfigError as exc:
            assert "Address family" in exc.message or "assign" in exc.message, exc.message
    with socket.socket(socket.AF_INET6) as taken6:
        try:
            taken6.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        taken6.listen()
        port = taken6.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot listen on \[::1\]:{port}"):
            serve.check_listen("::1", port)


# a setting other than its default for every ModelConfig field the demo ignores, in field order
DEMO_IGNORED_ARGV = {
    "model": ["--model", "FORCED"],  # any path: the demo reads none
    "backend": [],  # DEMO_MODEL_FIELDS: the backend is the demo, --device has its own warning
    "device": [],
    "load_format": ["--load-format", "safetensors"],
    "dtype": ["--dtype", "float32"],
    "forced_output": ["--forced-output", "FORCED"],
    "num_kv_blocks": ["--num-kv-blocks", "64"],
    "kv_cache_dtype": ["--kv-cache-dtype", "fp8_e4m3"],
    "kv_block_size": ["--kv-block-size", "32"],
    "max_new_tokens": ["--max-new-tokens", "100"],
    "prefill_graphs": [],  # DEMO_MODEL_FIELDS: its default is the command's
    "mem_fraction": ["--mem-fraction", "0.5"],
    "chunked_prefill_size": ["--chunked-prefill-size", "512"],
    "upload_batch_wait_ms": ["--upload-batch-wait-ms", "10"],
    "upload_hold": ["--upload-hold", "arrivals"],
    "upload_step_budget_ms": ["--upload-step-budget-ms", "50"],
    "upload_min_share": ["--upload-min-share", "0.2"],
    "live_step_budget_ms": ["--live-step-budget-ms", "30"],
    "live_decode_steps": ["--live-decode-steps", "2"],
    "live_draft": ["--no-live-draft"],
    "live_vad": ["--live-vad", "silero"],
    "live_forced_transcript_tokens": ["--live-forced-transcript-tokens", "900"],
    "live_forced_transcript_min_tokens": ["--live-forced-transcript-min-tokens", "300"],
    "live_hop_load": ["--live-hop-load", "0.3"],
}


def test_check_config_of_the_demo_names_every_moss_setting_it_ignores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo reads no MOSS-TD setting: `--live-vad silero` on it changed nothing and said
    nothing (session 51). Each one set is named once, spelled as typed, and the names parse
    back to the same settings."""
    from livemeet.backends.demo import DEMO_MODEL_FIELDS

    assert set(DEMO_IGNORED_ARGV) == {f.name for f in dataclasses.fields(ModelConfig)}, (
        "a new ModelConfig field: add a non-default setting of it here"
    )
    assert all(not DEMO_IGNORED_ARGV[name] for name in DEMO_MODEL_FIELDS)
    forced = tmp_path / "forced.txt"
    forced.write_text("[0.00][S01]Hello.[1.00]")
    flags = [a.replace("FORCED", str(forced)) for v in DEMO_IGNORED_ARGV.values() for a in v]
    argv = ["serve", "--data-dir", str(tmp_path), "--backend", "demo", *flags, "--check-config"]
    config = serve.config_from_args(build_parser().parse_args(argv[:-1]))
    assert config.model.backend_name == "demo"
    with caplog.at_level("INFO"):
        assert serve.run(build_parser().parse_args(argv)) == 0
    said = [r.getMessage() for r in caplog.records if "demo backend ignores" in r.getMessage()]
    assert len(said) == 1
    named, why = said[0].split("ignores ", 1)[1].split(": they are for MOSS-TD ", 1)
    assert why == "(--model without --backend demo)"
    in_field_order = [DEMO_IGNORED_ARGV[f.name] for f in dataclasses.fields(ModelConfig)]
    typed = [" ".join(v).replace("FORCED", str(forced)) for v in in_field_order if v]
    assert named == ", ".join(typed)
    again = ["serve", "--data-dir", str(tmp_path), "--backend", "demo"]
    again += " ".join(named.split(", ")).split()
    assert serve.config_from_args(build_parser().parse_args(again)).model == config.model


@pytest.mark.parametrize("command", [["serve"], ["transcribe", "a.wav"]])
def test_a_command_on_its_defaults_names_no_setting_the_demo_ignores(command: list[str]) -> None:
    """Each command's own defaults are no flags typed: every `transcribe` on the demo warned
    that it ignores --no-prefill-graphs (transcribe's default; a wheel trial)."""
    from livemeet.backends.demo import unused_flags

    args = build_parser().parse_args(command)
    assert unused_flags(serve.model_config_from_args(args)) == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--live-vad", "silero"],
            "the demo backend ignores --live-vad silero: it is for MOSS-TD (--model)",
        ),
        (["--no-live-vad"], "the demo backend ignores --no-live-vad: it is for MOSS-TD (--model)"),
        (["--live-vad", "webrtc", "--live-draft"], None),  # the defaults, said again
        ([], None),
    ],
)
def test_the_demo_says_which_setting_it_ignores_at_a_start(
    caplog: pytest.LogCaptureFixture, flags: list[str], said: str | None
) -> None:
    """A start of the demo (create_demo) warns as --check-config does, and only for a
    setting that differs from its default."""
    from livemeet.backends.demo import create_demo

    args = build_parser().parse_args(["serve", *flags])
    with caplog.at_level("WARNING"):
        create_demo(serve.model_config_from_args(args))
    ignored = [r.getMessage() for r in caplog.records if "demo backend ignores" in r.getMessage()]
    assert ignored == ([] if said is None else [said])


@pytest.mark.parametrize(("device", "warns"), [("cuda:3", True), ("tpu7", True), ("cpu", False)])
def test_check_config_of_the_demo_says_its_device_flag_has_no_effect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, device: str, warns: bool
) -> None:
    """The demo runs on the CPU whatever --device says: a start warned, --check-config said
    only "configuration ok" (a CLI trial: "the demo backend ignores --device")."""
    argv = ["serve", "--data-dir", str(tmp_path), "--device", device, "--check-config"]
    with caplog.at_level("INFO"):
        assert serve.run(build_parser().parse_args(argv)) == 0
    assert "configuration ok" in caplog.text
    said = f"the demo backend runs on the CPU: --device {device} has no effect"
    assert (said in caplog.text) is warns


def test_serve_check_config_validates_without_loading_or_listening(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --check-config` says whether `serve` would start with these flags: session 27's
    first GPU call lost its machine's start-up to a forced-budget floor `serve` refuses."""

    def must_not_run(*args: object) -> None:
        raise AssertionError("--check-config went past validation")

    monkeypatch.setattr("livemeet.gateway.app.create_app", must_not_run)
    monkeypatch.setattr(serve, "check_listen", must_not_run)
    base = ["serve", "--load-format", "dummy", "--data-dir", str(tmp_path), "--check-config"]

    def refused(*flags: str) -> str:
        caplog.clear()
        assert serve.run(build_parser().parse_args(base + list(flags))) == 2
        return caplog.text

    with caplog.at_level("INFO"):
        assert "floor must be >=" in refused("--live-forced-transcript-min-tokens", "64")
        assert serve.run(build_parser().parse_args(base)) == 0
        assert "configuration ok" in caplog.text
        # what a start reads before loading weights: the device, the checkpoint's
        # config.json, the forced transcript (a start found each only after its imports)
        assert "unknown device" in refused("--device", "tpu7")
        assert "does not exist" in refused("--model", str(tmp_path / "no-such-checkpoint"))
        assert "no config.json" in refused("--model", str(tmp_path))
        forced = tmp_path / "forced.txt"
        forced.write_text("no segments here")
        assert "holds no [start][Sxx]text[end]" in refused("--forced-output", str(forced))
        forced.write_bytes(b"\xff\xfe[0.00]")
        assert "cannot read --forced-output" in refused("--forced-output", str(forced))
        forced.write_text("[0.00][S01] hello[1.20]")
        assert serve.run(build_parser().parse_args(base + ["--forced-output", str(forced)])) == 0


def test_check_config_of_moss_needs_a_directory_for_torchs_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With /tmp read-only and TMPDIR unset, `--check-config --load-format dummy` passed and
    the start failed as torch made its cache directory (the container trial)."""
    import tempfile

    def no_usable_temporary_directory() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "gettempdir", no_usable_temporary_directory)
    argv = ["serve", "--load-format", "dummy", "--data-dir", str(tmp_path), "--check-config"]
    assert main(argv) == 2
    assert "torch cannot make its cache directory" in caplog.text
    assert "point TMPDIR (or TORCHINDUCTOR_CACHE_DIR) at one" in caplog.text


def test_allowed_origins_without_aiohttp_cors_are_a_config_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where aiohttp-cors is missing (the GPU image installs without dependencies), an
    --allowed-origin was a traceback at start-up and passed --check-config (a review)."""
    monkeypatch.setitem(sys.modules, "aiohttp_cors", None)  # import raises ImportError
    flags = ["serve", "--load-format", "dummy", "--data-dir", str(tmp_path)]
    origin = ["--allowed-origin", "https://app.example"]
    with caplog.at_level("INFO"):
        assert serve.run(build_parser().parse_args([*flags, *origin, "--check-config"])) == 2
        assert "needs the aiohttp-cors package" in caplog.text
        assert serve.run(build_parser().parse_args([*flags, "--check-config"])) == 0


def test_serve_refuses_an_unusable_data_dir_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file or an unwritable place as --data-dir was a traceback and exit 1 at start-up,
    and --check-config passed it (found by a trial). A directory still to be made is made."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = {a_file: "Not a directory", a_file / "sub": "Not a directory"}
    if not os.access(locked, os.W_OK):  # root writes anywhere
        cases[locked / "data"] = "Permission denied"
    for data_dir, reason in cases.items():
        caplog.clear()
        argv = ["serve", "--data-dir", str(data_dir), "--port", "0"]
        assert main([*argv, "--check-config"]) == 2
        assert f"cannot use --data-dir {data_dir}" in caplog.text and reason in caplog.text
        assert main(argv) == 2  # before any model is loaded
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "new" / "deeper")])
    serve.check_data_dir(serve.config_from_args(args))
    made = sorted(p.relative_to(tmp_path) for p in (tmp_path / "new").rglob("*"))
    assert [str(p) for p in made] == [
        "new/deeper",
        "new/deeper/live",
        "new/deeper/tmp",
        "new/deeper/transcriptions",
    ]  # and no probe file left


def test_a_data_dir_other_users_may_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It holds meetings' audio and transcripts: livemeet makes its directories 0700 now, and
    a start (or --check-config) on directories others may read says so (a security review)."""
    data_dir = tmp_path / "data"
    config = serve.config_from_args(
        build_parser().parse_args(["serve", "--data-dir", str(data_dir)])
    )
    with caplog.at_level("WARNING"):
        serve.check_data_dir(config)
        assert "readable by every user" not in caplog.text
        (data_dir / "live").chmod(0o755)
        serve.check_data_dir(config)
    assert f"{data_dir / 'live'} (mode 0755): readable by every user" in caplog.text
    assert str(data_dir / "tmp") not in caplog.text


def test_root_serving_another_users_data_dir_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server run as root on the service user's data dir kept a session whose audio was
    root's: the service user's next start was refused it (the container trial)."""
    data_dir = tmp_path / "data"
    config = serve.config_from_args(
        build_parser().parse_args(["serve", "--data-dir", str(data_dir)])
    )
    import pwd

    serve.check_data_dir(config)
    if os.geteuid() == 0:
        os.chown(data_dir, 4242, 4242)  # the service user's, no passwd entry
        owner = "uid 4242"
    else:  # as a user: this test's directory, and root that runs serve
        owner = pwd.getpwuid(os.geteuid()).pw_name
        monkeypatch.setattr(os, "geteuid", lambda: 0)
    with caplog.at_level("WARNING"):
        serve.check_data_dir(config)
    assert (
        f"serve runs as root on --data-dir {data_dir}, which is {owner}'s: what it writes "
        f"there will be root's, and a server run as {owner} is refused it later"
    ) in caplog.text
    caplog.clear()
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # its owner runs it: nothing to say
    with caplog.at_level("WARNING"):
        serve.check_data_dir(config)
    assert "serve runs as root" not in caplog.text


# every range a config checks, named by the flag the operator typed
OUT_OF_RANGE_FLAGS = [
    ("--port", "70000"),
    ("--live-hop-s", "10"),
    ("--live-resume-window", "-5"),
    ("--max-sessions", "0"),
    ("--max-concurrent-decodes", "0"),
    ("--max-upload-bytes", "0"),
    ("--max-audio-s", "0"),
    ("--upload-drain-s", "0"),
    ("--live-max-speed", "0.5"),
    ("--upload-min-share", "0.95"),
    ("--upload-batch-wait-ms", "-1"),
    ("--live-step-budget-ms", "1"),
    ("--upload-step-budget-ms", "1"),
    ("--live-decode-steps", "99"),
    ("--live-forced-transcript-tokens", "-1"),
    ("--live-forced-transcript-min-tokens", "50"),
    ("--live-hop-load", "5"),
    ("--mem-fraction", "2"),
    ("--chunked-prefill-size", "1"),
    ("--max-new-tokens", "0"),
    ("--num-kv-blocks", "0"),
]


@pytest.mark.parametrize(("flag", "value"), OUT_OF_RANGE_FLAGS)
def test_a_setting_out_of_range_is_named_by_its_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, flag: str, value: str
) -> None:
    """`serve --live-resume-window -5` said "live_resume_window_s must be >= 0", a name the
    operator never typed, and `--max-sessions 0` named --max-concurrent-decodes too (a new
    user's trial)."""
    argv = ["serve", "--data-dir", str(tmp_path), flag, value, "--check-config"]
    assert main(argv) == 2
    (error,) = (r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert error.startswith(f"{flag} must be ") or error.startswith(f"{flag}: "), error
    assert value in error


@pytest.mark.parametrize("value", ["-1", "-100000000", "-0.5", "nan", "inf"])
@pytest.mark.parametrize("flag", ["--min-free-disk-mb", "--retention-days"])
def test_a_negative_disk_setting_names_its_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, flag: str, value: str
) -> None:
    """The value as given (`%g` wrote -100000000 as -1e+08). nan passed `< 0`: the disk floor
    raised a ValueError traceback and a nan retention was "configuration ok" (a CLI trial)."""
    argv = ["serve", "--data-dir", str(tmp_path), "--port", "0", flag, value, "--check-config"]
    assert main(argv) == 2
    assert f"{flag} must be >= 0, not {value}\n" in caplog.text


def test_check_config_warns_of_a_disk_under_the_floor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A floor above the free space passed the check silently, and the server then refused
    every session (a trial): the check still passes (space may be freed) but says so."""
    usage = namedtuple("usage", "total used free")
    from livemeet.gateway import disk

    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage(10**12, 0, 100 << 20))
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--check-config"]
    assert main(argv) == 0
    assert "has 100 MiB free, under --min-free-disk-mb 512:" in caplog.text
    # the floor as given: `%g` logged 100000000 as 1e+08 (a trial)
    for floor in ("100000000", "1000.5"):
        caplog.clear()
        assert main([*argv, "--min-free-disk-mb", floor]) == 0
        assert f"has 100 MiB free, under --min-free-disk-mb {floor}:" in caplog.text


async def test_check_config_passes_beside_the_server_running_on_its_data_dir(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --check-config` exited 2 while the server it should vet for a restart held the
    data dir (a trial: a deploy gate, ExecStartPre): it now validates everything else, exits
    0 and names that server (its pid), whose stop a start needs. A start still refuses the
    data dir before loading anything, naming the holder as the journal's own refusal does."""
    from livemeet.gateway.live_journal import LiveJournal

    data_dir = tmp_path / "data"
    running = LiveJournal(data_dir / "live")
    running.load_unfinished()  # takes the lock, as a starting server does
    argv = ["serve", "--data-dir", str(data_dir), "--port", "0", "--check-config"]
    holder = f"another livemeet server (pid {os.getpid()}; one server per --data-dir)"
    with caplog.at_level("INFO"):
        assert main(argv) == 0
        assert f"--data-dir {data_dir} is in use now by {holder}: a start on it needs" in (
            caplog.text
        )
        assert "configuration ok" in caplog.text
        caplog.clear()
        # the rest is still checked beside the running server
        assert main([*argv, "--min-free-disk-mb", "-1"]) == 2
        assert "--min-free-disk-mb must be >= 0" in caplog.text
        caplog.clear()
        assert main(argv[:-1]) == 2  # a start refuses it, before loading anything
        assert f"cannot use --data-dir {data_dir}: {holder} is using it" in caplog.text
        await running.close()
        caplog.clear()
        assert main(argv) == 0
        assert "is in use now" not in caplog.text and "configuration ok" in caplog.text


def test_check_config_makes_the_data_dir_as_a_start_would(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --data-dir /proc/forbidden --check-config` said "configuration ok" (os.access
    says yes to root) and a start then failed with config_error (a user trial). The check
    now makes the directories and writes a probe file, failing as a start would, even as
    root: under a regular file, and in /proc."""
    under_a_file = tmp_path / "file" / "sub"
    cases = {
        Path("/proc/forbidden"): "cannot create /proc/forbidden: No such file or directory",
        under_a_file: f"cannot create {under_a_file / 'tmp'}: Not a directory",
    }
    (tmp_path / "file").write_text("x")
    for data_dir, reason in cases.items():
        caplog.clear()
        assert main(["serve", "--data-dir", str(data_dir), "--check-config"]) == 2
        assert reason in caplog.text, caplog.text
        assert "configuration ok" not in caplog.text


def test_a_data_dir_that_cannot_be_made_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PermissionError (as user nobody under a directory of root's, found by a review) is
    one ConfigError line naming the path, not a traceback at start-up."""

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "locked" / "data")])
    config = serve.config_from_args(args)
    with pytest.raises(ConfigError, match="cannot use --data-dir .*locked/data/tmp: Permission"):
        serve.check_data_dir(config)


def test_a_data_dir_another_users_run_made_is_refused_naming_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A data dir a root run had made (mode 0700), then the service user's start on it: a
    traceback from the stat of its lock file and exit 1, `--check-config` too (the
    container trial). One line now, naming the directory's owner and how to hand it over."""
    import pwd

    data_dir = tmp_path / "data"
    argv = ["serve", "--data-dir", str(data_dir), "--port", "0"]
    assert main([*argv, "--check-config"]) == 0  # made by this test's user
    owner = pwd.getpwuid(os.geteuid()).pw_name
    deny_access(monkeypatch, data_dir)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the service user, no passwd entry
    for check in (["--check-config"], []):  # a start stops before loading anything
        caplog.clear()
        assert main([*argv, *check]) == 2
        assert (
            f"cannot open the live journal's lock file {data_dir / 'live' / 'lock'}: "
            f"Permission denied ({data_dir} is {owner}'s, mode 0700, and livemeet runs as "
            f"uid 4242: another user's run made it? as root, `chown -R 4242 {data_dir}`; or run "
            f"livemeet as {owner})"
        ) in caplog.text


def test_a_data_dir_that_cannot_be_made_names_the_owner_of_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` started in a directory it may not write (a container's /) said "cannot create
    livemeet-data: Permission denied": whose the directory is, and who serve runs as, tell
    why; no chown is suggested for a place that is not the data dir."""
    import pwd

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.chdir(tmp_path)
    config = serve.config_from_args(build_parser().parse_args(["serve"]))
    with pytest.raises(ConfigError) as refused:
        serve.check_data_dir(config)
    st = tmp_path.stat()
    owner = pwd.getpwuid(st.st_uid).pw_name
    assert refused.value.message.endswith(
        f"Permission denied ({tmp_path} is {owner}'s, mode {st.st_mode & 0o7777:04o}, and "
        "livemeet runs as uid 4242)"
    )


def test_check_config_names_an_unknown_backend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # --data-dir: the check makes the directory (default ./livemeet-data, in the checkout)
    argv = ["serve", "--backend", "nosuch", "--data-dir", str(tmp_path), "--check-config"]
    assert main(argv) == 2
    assert "unknown backend 'nosuch'" in caplog.text


def test_check_config_reads_a_checkpoints_headers_tokenizer_and_prompt_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint without tokenizer.json, with a bad processor_config.json or a missing
    tensor passed --check-config and failed only at start (found by a trial): all are read
    now, without loading a weight."""
    from safetensors.torch import load_file, save_file

    from livemeet.models.tokenizer import load_tokenizer
    from tests.models.tiny import random_weights, write_upstream

    root = write_upstream(tmp_path / "ckpt", random_weights())
    base = ["serve", "--model", str(root), "--device", "cpu", "--check-config"]
    base += ["--data-dir", str(tmp_path / "data")]

    def check() -> tuple[int, str]:
        caplog.clear()
        return main(base), caplog.text

    with caplog.at_level("INFO"):
        status, text = check()
        assert status == 2 and "tokenizer.json" in text
        load_tokenizer(None).save(str(root / "tokenizer.json"))
        assert check()[0] == 0
        (root / "processor_config.json").write_text('{"time_marker_every_seconds": "five"}')
        assert check()[0] == 2
        (root / "processor_config.json").unlink()
        shard = next(root.glob("*.safetensors"))
        tensors = load_file(str(shard))
        key = sorted(tensors)[0]
        del tensors[key]
        save_file(tensors, str(shard))
        status, text = check()
        assert status == 2 and "missing tensors" in text and key in text


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        ([], "the demo backend needs faster-whisper"),
        (["--load-format", "dummy", "--live-vad", "silero"], "the Silero VAD needs faster-whisper"),
        (["--load-format", "dummy"], None),  # MOSS-TD with the WebRTC VAD needs no extra
    ],
)
def test_check_config_refuses_what_a_start_needs_from_the_demo_extra(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    refused: str | None,
) -> None:
    """`pip install livemeet` without `[demo]` (a wheel trial): `serve --check-config` said
    "configuration ok", then `serve` exited 2 with "the demo backend needs faster-whisper".
    The check now imports what a start imports, so it refuses with the same reason."""
    for name in ("faster_whisper", "faster_whisper.vad"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` raises ModuleNotFoundError
    argv = ["serve", *flags, "--data-dir", str(tmp_path), "--check-config"]
    with caplog.at_level("INFO"):
        status = main(argv)
    if refused is None:
        assert status == 0 and "configuration ok" in caplog.text
    else:
        assert status == 2 and refused in caplog.text and "livemeet[demo]" in caplog.text
        assert "configuration ok" not in caplog.text


def test_serve_rejects_half_tls(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--tls-cert", str(tmp_path / "c.pem")])
    with pytest.raises(ConfigError):
        serve.config_from_args(args)
    assert main(["serve", "--tls-cert", str(tmp_path / "c.pem")]) == 2


async def test_transcribe_files_and_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcriber = FakeTranscriber()
    await transcriber.start()
    good = write_wav(tmp_path / "good.wav", 3.0)
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"nope" * 100)
    results = await transcribe.transcribe_files(transcriber, [good, bad], language="en")
    assert results[0].transcript is not None
    assert results[0].transcript.text == expected_upload_text(3.0)
    assert isinstance(results[1].error, BadAudio)
    assert transcriber.sessions[0].log.aborted  # released after use

    out = tmp_path / "out"
    status = transcribe.write_results(results, ResponseFormat.SRT, out, "en")
    assert status == 1
    assert "S01: segment 1 café" in (out / "good.srt").read_text()
    assert "bad_audio" in capsys.readouterr().err

    single = tmp_path / "one.json"
    assert transcribe.write_results(results[:1], ResponseFormat.JSON, single, None) == 0
    assert json.loads(single.read_text())["text"] == expected_upload_text(3.0)
    assert transcribe.write_results(results[:1], ResponseFormat.TEXT, None, None) == 0
    assert capsys.readouterr().out == expected_upload_text(3.0) + "\n"


async def test_the_progress_bar_is_for_a_terminal_not_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`livemeet transcribe long.wav 2> log` wrote a progress bar's carriage-return frames into
    the log (a new user's trial): the bar is drawn only where stderr is a terminal."""
    transcriber = FakeTranscriber()
    await transcriber.start()
    wav = write_wav(tmp_path / "long.wav", transcribe.PROGRESS_MIN_S + 1.0)
    await transcribe.transcribe_file(transcriber, wav)
    assert "\r" not in capsys.readouterr().err  # captured: not a terminal

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    await transcribe.transcribe_file(transcriber, wav)
    assert "long.wav:" in terminal.getvalue()  # a terminal still gets it


async def test_a_bug_met_by_one_file_loses_no_other_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected exception on one file (a decoder's AttributeError, found by a trial)
    ended the run with a traceback and none of the other files written."""
    transcriber = FakeTranscriber()
    await transcriber.start()
    first, odd, last = (write_wav(tmp_path / f"{n}.wav", 1.0) for n in ("a", "odd", "z"))
    real = transcribe.transcribe_file

    async def flaky(transcriber: Any, path: Path, **kwargs: Any) -> Any:
        if path == odd:
            raise AttributeError("'NoneType' object has no attribute 'sample_rate'")
        return await real(transcriber, path, **kwargs)

    monkeypatch.setattr(transcribe, "transcribe_file", flaky)
    results = await transcribe.transcribe_files(transcriber, [first, odd, last], progress=False)
    assert [r.error is None for r in results] == [True, False, True]
    assert results[1].error is not None and results[1].error.code == "internal_error"
    out = tmp_path / "out"
    assert transcribe.write_results(results, ResponseFormat.TEXT, out, None) == 1
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "z.txt"]
    assert "odd.wav: internal_error: AttributeError" in capsys.readouterr().err


def test_transcribe_parser() -> None:
    args = build_parser().parse_args(["transcribe", "a.wav", "b.flac", "--format", "vtt"])
    assert args.audio == [Path("a.wav"), Path("b.flac")] and args.format == "vtt"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["transcribe", "a.wav", "--format", "mp3"])


@pytest.mark.parametrize(
    ("requested", "output", "expected"),
    [
        (None, "out.srt", ResponseFormat.SRT),
        (None, "OUT.VTT", ResponseFormat.VTT),
        (None, "hyp.json", ResponseFormat.JSON),
        (None, "hyp.diarized.json", ResponseFormat.DIARIZED_JSON),
        (None, "hyp.verbose.json", ResponseFormat.VERBOSE_JSON),
        (None, "notes.md", ResponseFormat.TEXT),
        (None, None, ResponseFormat.TEXT),
        ("vtt", "out.srt", ResponseFormat.VTT),  # --format wins
    ],
)
def test_transcribe_takes_the_format_from_the_output_name(
    requested: str | None, output: str | None, expected: ResponseFormat
) -> None:
    """`--output out.srt` without `--format` writes SRT (a user trial found plain text in it)."""
    path = None if output is None else Path(output)
    assert transcribe.format_for(requested, path) is expected


def test_transcribe_into_a_directory_keeps_the_default_format(tmp_path: Path) -> None:
    assert transcribe.format_for(None, tmp_path) is ResponseFormat.TEXT


@pytest.mark.parametrize(
    ("inputs", "output", "message"),
    [
        (["a.flac", "sub/a.mp3"], "out", "would both be written to"),  # same stem: a.srt
        (["a.wav", "b.wav"], "taken.txt", "several inputs need a directory"),
        (["a.wav"], "missing/o.srt", "does not exist"),
        (["a.wav", "b.wav"], "taken.txt/sub", "cannot create it"),
        (["-", "-"], "out", "can be given once"),
        # a trial's `--output o7.srt` for two inputs made a directory o7.srt of .txt files
        (["a.wav", "b.wav"], "o7.srt", "names a srt file, but several inputs"),
    ],
)
def test_transcribe_refuses_outputs_it_could_not_all_write_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    inputs: list[str],
    output: str,
    message: str,
) -> None:
    """An independent trial found the second of "a.flac a.mp3" overwriting the first's
    output silently, and an output in a missing directory failing with a traceback after
    the whole transcription. Now exit 2 with one line, before any model loads (the inputs
    need not even exist)."""
    (tmp_path / "taken.txt").write_text("keep me")
    paths = [p if p == "-" else str(tmp_path / p) for p in inputs]
    argv = ["transcribe", *paths, "--output", str(tmp_path / output)]
    assert transcribe.run(build_parser().parse_args([*argv, "--format", "srt"])) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert (tmp_path / "taken.txt").read_text() == "keep me"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("output", "flags", "hint"),
    [
        ("single.txt", [], None),  # text is what would be written: nothing to add
        ("single.srt", ["--format", "srt"], None),  # as asked already
        ("single.srt", [], ", and --format srt for srt files"),  # else text would be
    ],
)
def test_several_inputs_to_a_file_name_say_output_must_be_a_directory(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    output: str,
    flags: list[str],
    hint: str | None,
) -> None:
    """`transcribe a.wav b.mp3 --output single.txt` said "pass a directory (and --format
    text)", a hint unrelated to what was wrong (a trial): the message says several inputs
    need --output to be a directory, and names a --format only where one would change what
    is written."""
    path = tmp_path / output
    argv = ["transcribe", "a.wav", "b.mp3", "--output", str(path), *flags]
    assert transcribe.run(build_parser().parse_args(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: invalid_request: --output {path} names a ")
    assert "several inputs need --output to be a directory" in err
    if hint is None:
        assert err.endswith(": pass a directory") and "--format" not in err, err
    else:
        assert err.endswith(f": pass a directory{hint}"), err
    assert not path.exists()


def test_transcribe_output_ending_in_a_slash_is_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--output newdir/` for one input wrote a text file named newdir (found by a trial):
    the slash says directory, which is made, and the transcript goes inside it."""

    async def fake_run(args: Any, fmt: Any, streams: Any, output: Path | None) -> int:
        transcriber = FakeTranscriber()
        await transcriber.start()
        results = await transcribe.transcribe_files(transcriber, args.audio, progress=False)
        return transcribe.write_results(results, fmt, output, None)

    monkeypatch.setattr(transcribe, "_run", fake_run)
    good = write_wav(tmp_path / "good.wav", 1.0)
    argv = ["transcribe", str(good), "--output", str(tmp_path / "new" / "deeper") + "/"]
    assert transcribe.run(build_parser().parse_args(argv)) == 0
    assert (tmp_path / "new" / "deeper").is_dir()
    assert (tmp_path / "new" / "deeper" / "good.txt").read_text().strip()
    # refused outputs make no directory (a review: `out/` was made before the check)
    (tmp_path / "sub").mkdir()
    same_stem = [str(good), str(write_wav(tmp_path / "sub" / "good.wav", 1.0))]
    argv = ["transcribe", *same_stem, "--output", str(tmp_path / "out") + "/"]
    assert transcribe.run(build_parser().parse_args(argv)) == 2
    assert not (tmp_path / "out").exists()
    # the same Namespace runs twice (its --output was turned into a Path)
    args = build_parser().parse_args(["transcribe", str(good), "--output", str(tmp_path / "o/")])
    assert transcribe.run(args) == 0 and transcribe.run(args) == 0


async def test_transcribe_max_audio_s_is_the_callers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`transcribe` applied serve's 5,400-s limit with no way to change it (found by a
    trial): --max-audio-s now sets it, checked like serve's."""
    from livemeet.errors import TooLong

    transcriber = FakeTranscriber()
    await transcriber.start()
    path = write_wav(tmp_path / "three.wav", 3.0)
    (short,) = await transcribe.transcribe_files(transcriber, [path], max_audio_s=2.0)
    assert isinstance(short.error, TooLong) and short.error.code == "audio_too_long"
    (fits,) = await transcribe.transcribe_files(transcriber, [path], max_audio_s=3.5)
    assert fits.transcript is not None
    for bad in ("nan", "0", "-1", "inf"):
        argv = ["transcribe", str(path), "--max-audio-s", bad]
        assert transcribe.run(build_parser().parse_args(argv)) == 2
        assert "--max-audio-s must be a positive number" in capsys.readouterr().err
    # the refusal says how to raise the limit (a new user's 2-GB WAV said only "longer than
    # the 5400 s limit")
    assert transcribe.write_results([short], "text", None, None) == 1
    assert capsys.readouterr().err == (
        f"{path}: audio_too_long: the audio declares 3.0 s, longer than the 2 s limit "
        "(--max-audio-s raises it)\n"
    )


async def test_transcribe_output_distinct_stems_and_unwritable_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Distinct stems in one directory pass the check; a target that cannot be written (here
    a directory in its place) is reported for its file (status 1), the others still written."""
    transcriber = FakeTranscriber()
    await transcriber.start()
    paths = [write_wav(tmp_path / "a.wav", 1.0), write_wav(tmp_path / "b.wav", 1.0)]
    out = tmp_path / "out"
    transcribe.check_outputs(paths, ResponseFormat.SRT, out)
    transcribe.check_outputs(paths[:1], ResponseFormat.SRT, tmp_path / "one.srt")
    results = await transcribe.transcribe_files(transcriber, paths, progress=False)
    (out / "a.srt").mkdir(parents=True)  # cannot be written as a file
    assert transcribe.write_results(results, ResponseFormat.SRT, out, None) == 1
    assert "cannot write" in capsys.readouterr().err
    assert "S01" in (out / "b.srt").read_text()


def test_transcribe_reads_standard_input_and_pipes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-` and a pipe (/dev/stdin, a FIFO) are read whole: a pipe has no size, so probing it
    said "the audio file is empty (0 bytes)" (found by an independent trial)."""
    import os
    import threading

    wav = write_wav(tmp_path / "a.wav", 0.5).read_bytes()
    read_end, write_end = os.pipe()
    os.write(write_end, wav)
    os.close(write_end)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert transcribe.read_source(Path("-")) == wav
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(wav))
    writer.start()
    assert transcribe.read_source(fifo) == wav
    writer.join()
    assert transcribe.read_source(tmp_path / "a.wav") == tmp_path / "a.wav"  # by path
    with pytest.raises(BadAudio, match="directory"):
        transcribe.read_source(tmp_path)
    out = transcribe.output_path(tmp_path, Path("-"), ResponseFormat.SRT, many=True)
    assert out == tmp_path / "stdin.srt"


def test_transcribe_output_dash_is_standard_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--output -` wrote a file named `-` (a CLI trial): it means standard output, as `-`
    means standard input among the inputs."""
    seen: list[Path | None] = []

    async def record(args: Any, fmt: ResponseFormat, streams: Any, output: Path | None) -> int:
        seen.append(output)
        return 0

    monkeypatch.setattr(transcribe, "_run", record)
    monkeypatch.chdir(tmp_path)
    wav = str(write_wav(tmp_path / "a.wav", 0.1))
    assert main(["transcribe", wav, "--output", "-", "--format", "srt"]) == 0
    assert main(["transcribe", wav, wav, "--output", "-"]) == 0  # several: to stdout as without
    assert seen == [None, None] and not (tmp_path / "-").exists()


def test_transcribe_verbose_json_names_the_backends_one_language_as_an_upload_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`transcribe --format verbose_json` on the demo said "language": "unknown" where an
    upload of the same file to the demo server says "english" (a new user's trial): both
    report the request's language, else the backend's one language."""
    from livemeet.gateway import engine_client

    class EnglishOnly(FakeTranscriber):
        def __init__(self, model: Any, in_process: bool) -> None:
            super().__init__()
            self._info = dataclasses.replace(self._info, language="english", language_code="en")

    monkeypatch.setattr(engine_client, "EngineClient", EnglishOnly)
    wav, out = str(write_wav(tmp_path / "a.wav", 0.5)), tmp_path / "a.verbose.json"
    assert main(["transcribe", wav, "--output", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["language"] == "english"
    assert main(["transcribe", wav, "--output", str(out), "--language", "en-GB"]) == 0
    assert json.loads(out.read_text())["language"] == "en-GB"  # the request's, as sent


def test_transcribe_stopped_by_ctrl_c_says_so_in_one_line_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C mid-transcription printed a KeyboardInterrupt traceback (a CLI trial); the
    transcripts are written only once every file is done, so none is half-written."""

    async def interrupted(*args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(transcribe, "_run", interrupted)
    out = tmp_path / "a.srt"
    assert (
        main(["transcribe", str(write_wav(tmp_path / "a.wav", 0.1)), "--output", str(out)]) == 130
    )
    err = capsys.readouterr().err
    assert err.startswith("error: stopped by Ctrl-C") and err.count("\n") == 1
    assert "Traceback" not in err and not out.exists()


def test_transcribe_stream_errors_are_per_file_and_read_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that cannot be read is that file's bad_audio, not a crash of the whole run,
    and `-` at a terminal is refused rather than waiting for typed audio (a fresh-eyes
    review); streams are read by `read_streams`, in the caller's thread, before the model."""
    import socket

    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock_path))
        with pytest.raises(BadAudio, match="cannot read"):
            transcribe.read_source(sock_path)
        wav = write_wav(tmp_path / "a.wav", 0.5)
        streams = transcribe.read_streams([wav, sock_path])
        assert list(streams) == [sock_path] and isinstance(streams[sock_path], BadAudio)

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    with pytest.raises(BadAudio, match="terminal"):
        transcribe.read_source(Path("-"))


TOO_LONG_TEXT = [
    (["--language", "x" * 40], "--language must be at most 32 characters, not 40"),
    (["--prompt", "x" * 5_000], "--prompt must be at most 4,096 characters, not 5,000"),
    (["--hotword", "x" * 129], "--hotword must be at most 128 characters, not 129"),
    (["--hotword", "a"] * 257, "at most 256 --hotword values, not 257"),
    (["--language", "english"], "language 'english' is not a language code"),
]


@pytest.mark.parametrize("command", ["transcribe", "stream"])
@pytest.mark.parametrize(("flags", "message"), TOO_LONG_TEXT)
def test_request_text_is_capped_as_the_server_caps_it(
    command: str,
    flags: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user trial: `stream --language <40 chars>` exited 1 (the server refused it) and
    `transcribe --prompt <5,000 chars>` exited 0, though the upload and live APIs cap a
    prompt at 4,096. Both commands now refuse what the gateway would, exit 2, before the
    file is read or a model loads."""
    from livemeet.audio import decode

    def must_not_decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded a file despite a bad argument")

    monkeypatch.setattr(decode, "decode_file", must_not_decode)
    monkeypatch.setattr(decode, "decode_file_with_info", must_not_decode)
    monkeypatch.setattr(decode, "iter_decode", must_not_decode)
    argv = [command, "missing.wav", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_request_text_limits_are_the_gateways() -> None:
    """What the CLI takes, a live `start` takes, and what it refuses the `start` refuses."""
    from livemeet.cli.request_text import check_request_text
    from livemeet.errors import InvalidRequest
    from livemeet.gateway.live_protocol import LiveProtocol

    def start(**text: object) -> str:
        return json.dumps({"type": "start", "sample_rate": 16_000, **text})

    tag = "en-x-abcdefgh-abcdefgh-abcdefg-1"  # a valid language tag of 32 characters
    longest = {"language": tag, "prompt": "x" * 4_096, "hotwords": ["x" * 128] * 256}
    check_request_text(longest["language"], longest["prompt"], longest["hotwords"])  # type: ignore[arg-type]
    LiveProtocol().receive_text(start(**longest))
    for field, over in (
        ("language", tag + "2"),
        ("prompt", "x" * 4_097),
        ("hotwords", ["x"] * 257),
    ):
        text = {**longest, field: over}
        with pytest.raises(InvalidRequest):
            check_request_text(text["language"], text["prompt"], text["hotwords"])  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest):
            LiveProtocol().receive_text(start(**text))


def test_stream_sends_language_prompt_and_hotwords_in_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wav = write_wav(tmp_path / "a.wav", 1.0)
    starts: list[dict[str, Any]] = []

    async def server(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        starts.append(kwargs["start"])
        final = {"type": "transcript.final", "duration": 1.0}
        return live_client.StreamResult([final], [0.0], 1000, sent_s=1.0)

    monkeypatch.setattr(stream, "stream_audio", server)
    flags = ["--language", "en", "--prompt", "Minutes.", "--hotword", "Kubernetes"]
    assert main(["stream", str(wav), *flags, "--hotword", "Jane Doe"]) == 0
    assert starts == [
        {"language": "en", "prompt": "Minutes.", "hotwords": ["Kubernetes", "Jane Doe"]}
    ]


async def test_transcribe_passes_hotwords_to_the_session(tmp_path: Path) -> None:
    transcriber = FakeTranscriber()
    await transcriber.start()
    path = write_wav(tmp_path / "a.wav", 1.0)
    (result,) = await transcribe.transcribe_files(transcriber, [path], hotwords=["Kubernetes"])
    assert result.transcript is not None
    assert transcriber.sessions[0].log.options.hotwords == ("Kubernetes",)


async def test_stream_paced_in_hops(client: TestClient, fake: FakeTranscriber) -> None:  # noqa: F811
    samples = (0.1 * np.sin(np.arange(int(3.5 * 16000)) / 10)).astype(np.float32)
    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    seen: list[str] = []
    result = await live_client.stream_samples(
        url, samples, hop_s=0.5, speed=20.0, on_event=lambda e: seen.append(e["type"])
    )
    assert result.close_code == 1000
    assert result.final is not None and result.final["duration"] == 3.5
    assert seen[0] == "session.ready" and seen[-1] == "transcript.final"
    assert seen.count("segment.partial") == 2  # fake: 1 s hops, hop 3 commits (FINAL_EVERY)
    # paced: 3.5 s of audio at 20x takes >= 0.175 s before the final can arrive
    assert result.arrival_s[-1] >= 3.5 / 20
    assert fake.sessions[0].log.num_samples == 3.5 * 16000


async def test_stream_reports_server_error(client: TestClient) -> None:  # noqa: F811
    samples = np.zeros(1600, dtype=np.float32)
    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    result = await live_client.stream_samples(url, samples, start={"sample_rate": 5})
    assert result.error is not None and result.error["code"] == "bad_audio"
    assert result.close_code == 4415 and result.final is None


async def test_stream_reports_a_transcript_cut_short_by_a_drain(
    aiohttp_client: Any,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
) -> None:
    """A server shutting down with `--shutdown-live end` drains the session: its final covers
    only the audio received, then it closes 1001. `stream` exited 0 on that as if complete (a
    fresh-eyes review)."""
    from livemeet.gateway.app import close_live_sockets
    from tests.gateway.test_ws_live import gateway_client

    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")  # noqa: F811

    samples = (0.1 * np.sin(np.arange(4 * 16000) / 10)).astype(np.float32)
    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    asyncio.get_running_loop().call_later(
        0.3, lambda: asyncio.ensure_future(close_live_sockets(client.app))
    )
    result = await live_client.stream_samples(url, samples, hop_s=0.1, speed=4.0)
    assert result.close_code == GOING_AWAY and result.final is not None
    assert result.final["duration"] < 4.0
    # what was sent, not the file's length: frames in flight may reach a draining server
    assert result.final["duration"] <= result.sent_s < 4.0
    why = result.shortfall(4.0)
    assert why is not None and "1001" in why
    covered = result.final["duration"]
    assert (
        f"resend from {covered:.2f} s (stream --from-s {covered:.2f}; "
        f"the last {4.0 - covered:.2f} s" in why
    )
    assert f"{result.sent_s:.2f} s had been sent" in why
    # frames the server never read (its socket buffers): the final, not what was sent, says
    # where to resend from (a review: 30 s sent, 20 s covered read "the last 0.00 s were not")
    buffered = live_client.StreamResult([{"type": "transcript.final", "duration": 20.0}], [], 1001)
    buffered.sent_s = 30.0
    assert (
        "resend from 20.00 s (stream --from-s 20.00; the last 10.00 s are not transcribed"
        in str(buffered.shortfall(30.0))
    )
    full = live_client.StreamResult([{"type": "transcript.final", "duration": 4.0}], [0.0], 1000)
    assert full.shortfall(4.0) is None
    # 30.0000625 s (AMI dev00) arrive as 30.0 on the wire: that is all of it (found by a
    # trial: `stream` exited 1 on every file not a whole number of ms long)
    whole = live_client.StreamResult([{"type": "transcript.final", "duration": 30.0}], [0.0], 1000)
    assert whole.shortfall(30.0000625) is None
    assert whole.shortfall(30.002) is not None


@pytest.mark.parametrize("wait_revision", [True, False])
async def test_stream_keeps_the_final_of_a_session_ended_for_the_servers_storage(
    client: TestClient,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    wait_revision: bool,
) -> None:
    """The server's disk fills mid-stream: it ends the session itself, sends its final (the
    audio it took in), then storage_failed and 4507. `stream` keeps the final and the error,
    does not resume, and says where to resend from (with --no-wait-revision it closed at the
    final, no revision promised, and never read the error: a final of part of the file with
    no word of why)."""
    from livemeet.gateway import live_journal_writer
    from tests.gateway.test_ws_live import wait_until

    disk = {"full": False}
    real_sync = live_journal_writer.os.fdatasync

    def sync(fd: int) -> None:
        if disk["full"]:
            raise OSError(28, "No space left on device")
        real_sync(fd)

    async def fill() -> None:
        await wait_until(lambda: bool(fake.sessions) and fake.sessions[0].log.num_samples >= 16000)
        disk["full"] = True

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", sync)
    filling = asyncio.create_task(fill())
    samples = (0.1 * np.sin(np.arange(4 * 16000) / 10)).astype(np.float32)
    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    result = await live_client.stream_samples(
        url, samples, hop_s=0.1, speed=4.0, wait_revision=wait_revision
    )
    await filling
    assert result.final is not None and 1.0 <= result.final["duration"] < 4.0
    assert result.error is not None and result.error["code"] == "storage_failed"
    assert result.close_code == 4507
    closing = result.error_after_final
    assert closing is not None and closing["code"] == "storage_failed"
    assert "ended early" in closing["message"]
    assert result.close_code == 4507 and result.num_resumes == 0 and result.failure is None
    why = result.shortfall(4.0)
    assert why is not None and "(storage_failed, close 4507)" in why
    assert f"resend from {result.final['duration']:.2f} s" in why


def test_stream_of_a_session_ended_for_the_servers_storage_says_so_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After its final, the server closed the session with storage_failed: stderr says so
    with the server's message (the final may be the only copy: the transcript may not be
    stored), and the exit status is the final's coverage: 0 for all of the file (before, a
    silent 0), 1 for part of it, with where to resend from."""
    wav = write_wav(tmp_path / "ten.wav", 10.0)
    message = (
        "the server could not store this session's audio (No space left on device): the "
        "session's audio is no longer stored; its transcript.final (all the audio the "
        "server took in) was sent but could not be stored: keep the copy received; the "
        "session cannot be resumed"
    )
    events = [
        {"type": "session.ready", "session_id": "s-1", "revise": False},
        {"type": "transcript.final", "duration": 10.0},
        {"type": "error", "code": "storage_failed", "message": message, "retryable": True},
    ]
    whole = live_client.StreamResult(events, [0.0, 10.1, 10.2], 4507, sent_s=10.0)

    async def ended(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        return result

    monkeypatch.setattr(stream, "stream_audio", ended)
    result = whole
    assert main(["stream", str(wav)]) == 0
    err = capsys.readouterr().err
    assert "warning: after transcript.final the server closed the session with " in err
    assert f"storage_failed: {message} (close 4507)" in err
    events[1] = {"type": "transcript.final", "duration": 6.0}
    times = [0.0, 6.1, 6.2]
    result = live_client.StreamResult(events, times, 4507, sent_s=6.5, stopped_early=True)
    assert main(["stream", str(wav)]) == 1
    err = capsys.readouterr().err
    assert "storage_failed: " in err
    assert "the server ended the session early (storage_failed, close 4507)" in err
    assert "resend from 6.00 s" in err


def test_stream_cut_short_by_a_drain_says_what_was_sent_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server SIGTERMed 6 s into a real-time stream of a 30-s file: `stream` said "after
    6.00 s of the 30.00 s streamed" (30 s is the file's length, 6 s were sent; a user trial).
    Exit 1, as the README's table has it for a final that covers only part of the file."""
    wav = write_wav(tmp_path / "thirty.wav", 30.0)

    async def drained(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        final = {"type": "transcript.final", "duration": 6.0}
        return live_client.StreamResult([final], [6.1], GOING_AWAY, sent_s=6.0, stopped_early=True)

    monkeypatch.setattr(stream, "stream_audio", drained)
    assert main(["stream", str(wav)]) == 1
    err = capsys.readouterr().err
    assert "the transcript covers 6.00 s of the 30.00 s file; resend from 6.00 s" in err
    assert (
        "(stream --from-s 6.00; the last 24.00 s are not transcribed; 6.00 s had been sent)" in err
    )
    # a drain after the whole file was sent: the transcript is complete
    final = {"type": "transcript.final", "duration": 30.0}
    whole = live_client.StreamResult([final], [30.1], GOING_AWAY, sent_s=30.0)
    assert whole.shortfall(30.0) is None


def test_stream_says_to_resend_from_no_later_than_the_audio_the_server_read() -> None:
    """The place to resend from is floored to the hundredth it is shown in: rounded, a final
    of 6.375 s (hops of 0.125 s) read "resend from 6.38 s", and `stream --from-s 6.38` then
    skipped 5 ms the server never read; so did 16.007 s after `--from-s 10.007`."""

    def hint(duration_s: float, from_s: float = 0.0) -> str:
        final = {"type": "transcript.final", "duration": duration_s}
        cut = live_client.StreamResult(
            [final], [1.0], GOING_AWAY, sent_s=duration_s, stopped_early=True
        )
        why = cut.shortfall(30.0, from_s)
        assert why is not None
        return why

    assert "covers 6.37 s of the 30.00 s file; resend from 6.37 s (stream --from-s 6.37;" in (
        hint(6.375)
    )
    assert "covers 10.01-16.00 s of the 30.00 s file; resend from 16.00 s" in hint(6.0, 10.007)
    assert "resend from 0.29 s (stream --from-s 0.29;" in hint(0.29)  # not 0.28: 28.999...


def test_stream_from_s_sends_the_file_from_there_and_says_where_the_rest_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stream` said "resend from 6.00 s" and had no way to do it (a new user's trial):
    --from-s sends the file's audio from that second, and a stream stopped again says where
    the rest starts in the file's seconds, not the new session's."""
    wav = write_wav(tmp_path / "thirty.wav", 30.0)
    whole = decode_file(wav)
    sent: list[np.ndarray] = []

    async def drained(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        sent.extend(chunks)
        final = {"type": "transcript.final", "duration": 6.0}
        return live_client.StreamResult([final], [6.1], GOING_AWAY, sent_s=6.0, stopped_early=True)

    monkeypatch.setattr(stream, "stream_audio", drained)
    assert main(["stream", str(wav), "--from-s", "10"]) == 1
    assert np.array_equal(np.concatenate(sent), whole[10 * 16000 :])
    err = capsys.readouterr().err
    assert "sending from 10.00 s into the audio: the transcript's times count from there" in err
    assert "covers 10.00-16.00 s of the 30.00 s file; resend from 16.00 s" in err
    assert "(stream --from-s 16.00; the last 14.00 s are not transcribed" in err

    async def complete(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        samples = np.concatenate(list(chunks))
        final = {"type": "transcript.final", "duration": round(samples.size / 16000, 3)}
        return live_client.StreamResult([final], [1.0], 1000, sent_s=samples.size / 16000)

    monkeypatch.setattr(stream, "stream_audio", complete)
    assert main(["stream", str(wav), "--from-s", "16.0000625"]) == 0  # a part sample: rounded


def test_stream_from_s_of_a_file_damaged_mid_way_says_where_sending_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The damage's note counted from the --from-s point without saying so (a review)."""
    wav = write_wav(tmp_path / "thirty.wav", 30.0)

    async def damaged(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        final = {"type": "transcript.final", "duration": 5.0}
        return live_client.StreamResult(
            [final], [5.1], 1000, sent_s=5.0, audio_error=BadAudio("cut"), stopped_early=True
        )

    monkeypatch.setattr(stream, "stream_audio", damaged)
    assert main(["stream", str(wav), "--from-s", "10"]) == 1
    assert "cut (after 5.00 s of audio from 10.00 s; the transcript covers 5.00 s)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("value", ["30", "31.5"])
def test_stream_from_s_at_or_past_the_end_exits_2_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """Nothing to send is said before connecting (nothing listens at the --url), as for a
    file that does not decode: exit 2."""
    wav = write_wav(tmp_path / "thirty.wav", 30.0)
    assert main(["stream", str(wav), "--from-s", value, "--url", "ws://127.0.0.1:9/v1/live"]) == 2
    err = capsys.readouterr().err
    assert f"the audio ends at 30.00 s: nothing after --from-s {float(value):g}" in err
    assert str(wav) in err


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "four"])
def test_stream_from_s_not_seconds_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    wav = write_wav(tmp_path / "thirty.wav", 30.0)
    with pytest.raises(SystemExit) as exited:
        main(["stream", str(wav), "--from-s", value])
    assert exited.value.code == 2
    assert "--from-s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "used"),
    [
        # ws/wss: the endpoint, as given; only a URL without any path gets LIVE_PATH
        ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/live"),
        ("wss://meet.example.com", "wss://meet.example.com/v1/live"),
        ("ws://127.0.0.1:8000?token=t", "ws://127.0.0.1:8000/v1/live?token=t"),
        ("ws://127.0.0.1:8000/", "ws://127.0.0.1:8000/"),  # a proxy may serve it at /
        ("ws://127.0.0.1:8000/v1/live", "ws://127.0.0.1:8000/v1/live"),
        ("ws://proxy.example.com/livemeet/v1/live", "ws://proxy.example.com/livemeet/v1/live"),
        ("wss://proxy.example.com/live?token=t", "wss://proxy.example.com/live?token=t"),
        ("WS://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/live"),
        # http/https: the server's address (its page's), whose live endpoint is taken
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/live"),
        ("http://127.0.0.1:8000/", "ws://127.0.0.1:8000/v1/live"),
        ("https://meet.example.com/livemeet/", "wss://meet.example.com/livemeet/v1/live"),
        ("https://meet.example.com/livemeet", "wss://meet.example.com/livemeet/v1/live"),
        ("http://127.0.0.1:8000/v1/live", "ws://127.0.0.1:8000/v1/live"),
        ("https://h.example.com/p/v1/live?token=t", "wss://h.example.com/p/v1/live?token=t"),
    ],
)
def test_stream_url_names_the_live_endpoint(given: str, used: str) -> None:
    """`--url ws://127.0.0.1:8000` failed with "server rejected WebSocket connection: HTTP
    200" (the web page; a user trial), so it gets the live path; but an explicit `/` was
    rewritten too, which a proxy serving the endpoint at its root could not be reached with
    (a review), and an http:// URL, the address a browser shows, failed as not ws://."""
    assert stream.live_url(given) == used


@pytest.mark.parametrize(
    "given",
    [
        "127.0.0.1:8000",
        "localhost:8000",
        "ftp://h/v1/live",
        "ws:///v1/live",
        "ws://h/#x",
        # urlsplit and .port raise ValueError on these: a traceback and exit 1 (a CLI trial)
        "http://[::1",
        "http://127.0.0.1:99999",
        "ws://127.0.0.1:abc/v1/live",
    ],
)
def test_stream_refuses_a_url_that_names_no_websocket(
    given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused up front with exit 2 and one line, before the file is decoded."""
    with pytest.raises(InvalidRequest, match="--url"):
        stream.live_url(given)
    assert main(["stream", str(write_wav(tmp_path / "a.wav", 0.1)), "--url", given]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid_request: --url") and err.count("\n") == 1


def test_wss_to_a_server_without_tls_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url wss://...` to a plain `livemeet serve` said only "[SSL: WRONG_VERSION_NUMBER]
    wrong version number" (a new user's trial)."""
    import http.server

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"wss://127.0.0.1:{server.server_address[1]}"
        assert main(["stream", str(write_wav(tmp_path / "a.wav", 0.1)), "--url", url]) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert "WRONG_VERSION_NUMBER" in err and "the server does not speak TLS" in err


def test_a_server_that_is_not_running_says_to_start_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stream FILE` with no server on its default address said only "cannot connect to
    ws://127.0.0.1:8000/v1/live: [Errno 111] Connect call failed" (a new user's trial)."""
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{probe.getsockname()[1]}/v1/live"
        assert main(["stream", str(write_wav(tmp_path / "a.wav", 0.1)), "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot connect to {url}: ") and err.count("\n") == 1
    assert "nothing listens there: start `livemeet serve`, or give its address, --url" in err


@pytest.mark.parametrize(
    ("given", "suggested"),
    [
        ("ws://h:8000/", "ws://h:8000/v1/live"),
        ("ws://h:8000/v1/live/", "ws://h:8000/v1/live"),
        ("ws://h:8000/v1", "ws://h:8000/v1/live"),
        ("ws://h:8000/v1/models", "ws://h:8000/v1/live"),
        ("wss://h/meet/v1/audio/transcriptions", "wss://h/meet/v1/live"),
        ("ws://h/meet", "ws://h/meet/v1/live"),  # a proxy's prefix
        ("ws://h/meet/?x=1", "ws://h/meet/v1/live?x=1"),
    ],
)
def test_a_wrong_ws_path_gets_the_live_endpoint_suggested(given: str, suggested: str) -> None:
    """`--url ws://host:8000/v1/live/` was told "did you mean ws://host:8000/v1/live/v1/live?",
    and `.../v1/models` ".../v1/models/v1/live" (a new user's trial): the live endpoint is
    beside the API's other paths, not under them."""
    assert stream.wrong_path_hint(given).endswith(f"did you mean {suggested}?")


async def test_stream_to_a_server_url_without_a_path(client: TestClient) -> None:  # noqa: F811
    root = str(client.make_url("")).replace("http", "ws", 1)
    page = str(client.make_url("/"))  # http://127.0.0.1:PORT/, as a browser shows it
    samples = np.zeros(8_000, dtype=np.float32)
    for url in (root, page):
        result = await live_client.stream_samples(stream.live_url(url), samples, speed=100.0)
        assert result.close_code == 1000 and result.final is not None
    # ws://host:port/ is taken as given: the page answers, and the error says what to try
    with pytest.raises(websockets.InvalidStatus, match="HTTP 200"):
        await live_client.stream_samples(stream.live_url(root + "/"), samples, speed=100.0)
    assert stream.wrong_path_hint(root + "/").endswith(f"did you mean {root}/v1/live?")
    assert "livemeet server's /v1/live?" in stream.wrong_path_hint(root + "/v1/live")


async def test_stream_refused_by_the_server_could_not_run_and_exits_2(
    client: TestClient,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server that refuses to start the session (at capacity here; not ready, a low disk)
    answers `start` with an error: `stream` could not run, exit 2 as the README has it for
    no server to connect to (it exited 1, the code for work that ran and fell short)."""
    fake.open_error = QueueFull("all 1 session slots are in use (--max-sessions); retry later")
    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    result = await live_client.stream_samples(url, np.zeros(8_000, np.float32), speed=100.0)
    assert result.final is None and result.close_code == 4429
    assert stream.report(result, tmp_path / "unused.wav") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the server refused the session: queue_full: all 1 session")


def test_captions_links_of_a_new_session_on_the_server_of_the_live_url() -> None:
    """`stream` printed no captions_token (only --json showed session.ready whole), so its
    user had no overlay URL for OBS and no transcript URL (a trial). Then both on one line,
    the overlay's followed by "; transcript:", so a terminal's link to it, or a double-click,
    took the ';' into the token: the overlay was refused (a new user's trial)."""
    ready = {
        "type": "session.ready",
        "session_id": "s 1",
        "captions_token": "t/k",
        "resumed": False,
    }
    links = stream.captions_links("wss://meet.example/meet/v1/live?x=1", ready)
    assert links is not None
    # one URL a line, and last on it: what a terminal makes a link of, the token intact
    overlay, transcript = (line.split()[-1] for line in links.splitlines())
    assert overlay == "https://meet.example/meet/captions.html?session=s%201&token=t%2Fk"
    assert transcript == "https://meet.example/meet/v1/sessions/s%201/transcript?token=t%2Fk"
    assert links.splitlines()[0].startswith("captions overlay (read-only): ")
    assert "http://127.0.0.1:8000/captions.html?" in str(
        stream.captions_links("ws://127.0.0.1:8000/v1/live", ready)
    )
    assert stream.captions_links("ws://h/v1/live", {**ready, "resumed": True}) is None
    assert stream.captions_links("ws://h/v1/live", {**ready, "captions_token": None}) is None
    assert stream.captions_links("ws://h/", ready) is None  # a proxy's own path: page unknown


def test_format_event_lines() -> None:
    seg = {"id": "seg-0001", "start": 1.0, "end": 2.5, "speaker": "S01", "text": "hi"}
    assert stream.format_event({"type": "segment.final", **seg}).startswith("= [")
    assert "rev 3" in stream.format_event({"type": "segment.partial", "rev": 3, "segments": [seg]})
    assert "DEMO" in stream.format_event(
        {"type": "session.ready", "session_id": "x", "protocol": 0, "demo": True, "model": "m"}
    )
    # speaker events read as lines, not JSON (a name or merge made on the recorder page)
    renamed = {"type": "speaker.renamed", "speaker": "S01", "name": "Zoë"}
    assert stream.format_event(renamed) == '# speaker S01 named "Zoë"'
    unnamed = stream.format_event({**renamed, "name": None})
    assert unnamed == "# speaker S01 name removed"
    merged = {"type": "speaker.merged", "speaker": "S03", "into": "S01"}
    assert stream.format_event(merged).startswith("# speaker S03 merged into S01")
    # one segment, or final, is not "1 segments" (a new user's trial: a Ctrl-C after 4 s)
    final = {"type": "transcript.final", "segments": [seg], "duration": 4.0, "coverage": 1.0,
             "finish_reason": "stop"}  # fmt: skip
    assert (
        stream.format_event(final)
        == "# transcript.final: 1 segment, 4.00 s, segments to 100% of it, stop"
    )
    short = stream.format_event({**final, "coverage": 0.9612})
    assert short == "# transcript.final: 1 segment, 4.00 s, segments to 96% of it, stop"
    revised = {**final, "type": "transcript.revised", "supersedes": ["seg-0001"]}
    assert stream.format_event(revised).splitlines()[0] == (
        "# transcript.revised: 1 segment, superseding 1 final, stop"
    )
    two = stream.format_event({**revised, "segments": [seg, seg], "supersedes": []})
    assert two.startswith("# transcript.revised: 2 segments, superseding 0 finals, stop")


async def live_url(aiohttp_server: Any, handler: Any) -> str:
    """The ws:// URL of a test server whose /v1/live is `handler`."""
    app = web.Application()
    app.router.add_get("/v1/live", handler)
    server = await aiohttp_server(app)
    return str(server.make_url("/v1/live")).replace("http", "ws", 1)


async def test_stream_times_out_when_no_final_arrives(aiohttp_server: Any) -> None:
    # A server that accepts the session and then never answers `end`: the client must give
    # up with `timed_out`, not raise TimeoutError (an OSError, once reported as "cannot connect").
    async def silent(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "session.ready", "session_id": "s", "demo": True})
        async for _ in ws:
            pass
        return ws

    url = await live_url(aiohttp_server, silent)
    samples = np.zeros(1600, dtype=np.float32)
    result = await live_client.stream_samples(url, samples, speed=100.0, final_timeout_s=0.2)
    assert result.timed_out and result.final is None
    assert [e["type"] for e in result.events] == ["session.ready"]


def test_stream_takes_files_longer_than_an_upload_may_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stream long95m.wav` was refused with audio_too_long, the 90-minute upload limit (a
    user trial), though a live session has no length limit. This file's header is made to
    declare 95 minutes, which is what the limit was checked against first."""
    import dataclasses

    from livemeet.audio import decode

    wav = write_wav(tmp_path / "long95m.wav", 1.0)
    real_probe = decode._probe

    def declares_95_minutes(source: decode.AudioSource) -> Any:
        probed = real_probe(source)
        info = dataclasses.replace(probed.info, duration_s=5_700.0)
        return probed._replace(info=info, exact_duration=False)

    streamed: list[int] = []

    async def server(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        streamed.append(sum(chunk.size for chunk in chunks))
        final = {"type": "transcript.final", "duration": streamed[-1] / 16_000}
        result = live_client.StreamResult(events=[final], arrival_s=[0.0], close_code=1000)
        result.sent_s = streamed[-1] / 16_000
        return result

    monkeypatch.setattr(decode, "_probe", declares_95_minutes)
    monkeypatch.setattr(stream, "stream_audio", server)
    assert main(["stream", str(wav), "--speed", "1000"]) == 0
    assert streamed == [16_000]


async def test_transcribe_and_stream_of_a_cut_wav_warn_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cut WAV is transcribed as far as it goes (docs/protocol.md), and both commands said
    nothing of the rest (a trial): one warning line on stderr, the exit status unchanged."""
    data = write_wav(tmp_path / "whole.wav", 2.0).read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: 44 + 16_000])
    warning = (
        f"warning: {cut}: the audio is cut: its header declares 2.00 s, the file holds 0.50 s "
        "(1.50 s missing); the part it holds is transcribed\n"
    )
    transcriber = FakeTranscriber()
    await transcriber.start()
    (result,) = await transcribe.transcribe_files(transcriber, [cut], progress=False)
    assert result.error is None and transcriber.sessions[0].log.num_samples == 8_000
    assert capsys.readouterr().err == warning

    async def server(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        sent_s = sum(chunk.size for chunk in chunks) / 16_000
        final = {"type": "transcript.final", "duration": sent_s}
        return live_client.StreamResult([final], [0.0], 1000, sent_s=sent_s)

    monkeypatch.setattr(stream, "stream_audio", server)
    assert await asyncio.to_thread(main, ["stream", str(cut), "--speed", "1000"]) == 0
    assert capsys.readouterr().err == warning
    assert await asyncio.to_thread(main, ["stream", str(tmp_path / "whole.wav")]) == 0
    assert capsys.readouterr().err == ""


def record_streamed(monkeypatch: pytest.MonkeyPatch) -> list[npt.NDArray[np.float32]]:
    """Stand in for the server of `livemeet stream`: the list returned gets each session's
    samples (16 kHz float32), and the session's final covers all of them."""
    sent: list[npt.NDArray[np.float32]] = []

    async def server(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        sent.append(np.concatenate(list(chunks)))
        sent_s = sent[-1].size / 16_000
        final = {"type": "transcript.final", "duration": sent_s}
        return live_client.StreamResult([final], [0.0], 1000, sent_s=sent_s)

    monkeypatch.setattr(stream, "stream_audio", server)
    return sent


async def stream_standard_input(data: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    """`livemeet stream - --speed 1000`'s exit status, `data` written into its standard input
    through a pipe."""
    read_fd, write_fd = os.pipe()

    def write_standard_input() -> None:
        with open(write_fd, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=write_standard_input)
    writer.start()
    try:
        with open(read_fd, "rb") as stdin:
            monkeypatch.setattr(sys, "stdin", stdin)
            return await asyncio.to_thread(main, ["stream", "-", "--speed", "1000"])
    finally:
        writer.join()


async def test_transcribe_and_stream_take_a_flac_behind_cover_art(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_data: Path
) -> None:
    """A FLAC behind an ID3v2 tag of 3 MiB (cover art, as some rippers write it) was
    bad_audio from `stream -`, and from `transcribe FILE` and `stream FILE` unless FILE's
    name ended in .flac (FFmpeg's probe, not reaching the FLAC, trusted the name). Each now
    takes the samples of the FLAC without its tag."""
    from livemeet.audio import decode

    untagged = shared_data / "jfk" / "jfk.flac"  # 11 s, 44.1 kHz stereo
    data = id3v2_tag(3 << 20) + untagged.read_bytes()
    files = [tmp_path / "cover.flac", tmp_path / "cover"]
    for tagged in files:
        tagged.write_bytes(data)
    expected = decode.decode_file(untagged)

    decoded: list[decode.Decoded] = []
    real = decode.decode_file_with_info

    def spy(source: decode.AudioSource, **kwargs: Any) -> decode.Decoded:
        decoded.append(real(source, **kwargs))
        return decoded[-1]

    monkeypatch.setattr(decode, "decode_file_with_info", spy)
    transcriber = FakeTranscriber()
    await transcriber.start()
    results = await transcribe.transcribe_files(transcriber, files, progress=False)
    assert [r.error for r in results] == [None, None]
    assert [s.log.num_samples for s in transcriber.sessions] == [expected.size] * 2
    for got in decoded:
        np.testing.assert_array_equal(got.samples, expected)

    sent = record_streamed(monkeypatch)
    for tagged in files:
        assert await asyncio.to_thread(main, ["stream", str(tagged), "--speed", "1000"]) == 0
    assert await stream_standard_input(data, monkeypatch) == 0
    assert len(sent) == 3
    for samples in sent:
        np.testing.assert_array_equal(samples, expected)


async def test_transcribe_and_stream_of_standard_input_take_a_wav_behind_cover_art(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 5-s WAV behind 100 kB of cover art (an ID3v2 tag) on standard input: `transcribe -`,
    which reads it whole (bytes), transcribed 1.9 s of it without an error (libsndfile sized
    the data from the whole input, tag included), and `stream -` refused it (bad_audio).
    Each now takes the samples of the WAV without its tag."""
    from livemeet.audio import decode

    wav = write_wav(tmp_path / "a.wav", 5.0).read_bytes()
    data = id3v2_tag(100_000) + wav
    expected = decode.decode_file(wav)
    transcriber = FakeTranscriber()
    await transcriber.start()
    standard_input = Path("-")
    results = await transcribe.transcribe_files(
        transcriber, [standard_input], progress=False, streams={standard_input: data}
    )
    assert [r.error for r in results] == [None]
    assert [s.log.num_samples for s in transcriber.sessions] == [expected.size]

    sent = record_streamed(monkeypatch)
    assert await stream_standard_input(data, monkeypatch) == 0
    assert len(sent) == 1
    np.testing.assert_array_equal(sent[0], expected)


def test_serve_with_a_broken_checkpoint_exits_2_with_one_line(tmp_path: Path) -> None:
    """A model that fails to load stops `serve` with its typed error in one log line and
    exit status 2, as `transcribe` does (an independent trial got a 40-line traceback)."""
    cmd = [sys.executable, "-m", "livemeet", "serve", "--model", str(tmp_path), "--port", "0"]
    cmd += ["--data-dir", str(tmp_path / "data")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config_error: no config.json in" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_stream_cut_off_by_head_is_quiet_not_a_connection_error(tmp_path: Path) -> None:
    """`livemeet stream ... --json | head -3` said "cannot connect ...: Broken pipe", exit 2
    (found by a trial): its connection-error clause caught the pipe's OSError."""
    script = tmp_path / "cut.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import numpy as np
            from livemeet.__main__ import main
            from livemeet.audio import decode
            from livemeet.cli import stream

            async def chatty(url, chunks, *, on_event, **kwargs):
                for k in range(100_000):
                    on_event({"type": "segment.partial", "rev": k, "segments": []})

            stream.stream_audio = chatty
            decode.iter_decode = lambda *a, **k: (x for x in [np.zeros(16000, np.float32)])
            sys.exit(main(["stream", "any.wav", "--json", "--url", "ws://127.0.0.1:9/v1/live"]))
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "cannot connect" not in err and "Traceback" not in err


def test_output_cut_off_by_head_is_quiet(shared_data: Path) -> None:
    # `livemeet eval ... --json | head -1` used to end in a BrokenPipeError traceback.
    data = shared_data / "meeteval-examples"
    cmd = [sys.executable, "-m", "livemeet", "eval", "--json"]
    cmd += ["--ref", str(data / "ref.stm"), "--hyp", str(data / "hyp.stm")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err


# ---- `stream` decodes as it sends (hours of audio in bounded memory)


def capturing_live_server(received: list[bytes]) -> web.Application:
    """A live endpoint that keeps every audio frame and answers `end` with a final covering
    them (no model: the bytes are the point)."""

    async def live(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        await ws.send_json({"type": "session.ready", "session_id": "s", "demo": True})
        async for msg in ws:
            if msg.type == web.WSMsgType.BINARY:
                received.append(msg.data)
            elif json.loads(msg.data)["type"] == "end":
                duration_s = sum(len(b) for b in received) / 2 / 16_000
                final = {"type": "transcript.final", "segments": [], "duration": duration_s}
                await ws.send_json({**final, "finish_reason": "stop", "coverage": 1.0})
                await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/v1/live", live)
    return app


@pytest.mark.parametrize("name", ["pcm16.wav", "stereo44k.flac", "stereo44k.mp3", "speech.m4a"])
async def test_stream_sends_the_samples_of_a_whole_decode(
    name: str,
    aiohttp_server: Any,
    shared_data: Path,
    encoded_clips: dict[str, EncodedClip],  # noqa: F811
) -> None:
    """`stream` decoded the whole file before sending (~230 MB an hour of audio); decoded as
    it is sent, the frames are still those of the whole decode, byte for byte: a 16 kHz WAV,
    a 44.1 kHz stereo FLAC (resampled), a 44.1 kHz stereo MP3 (FFmpeg, resampled) and an M4A
    (its last AAC frame cut where the edit list ends)."""
    from livemeet.audio.decode import decode_file, iter_decode

    paths = {
        "pcm16.wav": shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav",
        "stereo44k.flac": shared_data / "jfk" / "jfk.flac",
        "stereo44k.mp3": encoded_clips["stereo44k.mp3"].path,
        "speech.m4a": encoded_clips["speech.m4a"].path,
    }
    received: list[bytes] = []
    server = await aiohttp_server(capturing_live_server(received))
    url = str(server.make_url("/v1/live")).replace("http", "ws", 1)
    result = await live_client.stream_audio(url, iter_decode(paths[name]), hop_s=0.5, speed=1e6)
    whole = decode_file(paths[name])
    assert b"".join(received) == live_client.to_pcm16(whole)
    assert {len(b) for b in received[:-1]} == {16_000}  # 0.5 s frames, as before
    assert result.sent_s == whole.size / 16_000 and not result.stopped_early
    assert result.final is not None and result.shortfall(result.sent_s) is None


async def test_stream_dash_sends_standard_input_as_it_comes(
    aiohttp_server: Any, shared_data: Path
) -> None:
    """`livemeet stream -` was "cannot read the audio file: No such file or directory" (a CLI
    trial). Now it reads standard input as it comes, here a process's pipe: the frames are
    those of a whole decode of the same bytes, and the final covers them (exit 0)."""
    from livemeet.audio.decode import decode_file

    repo_root = Path(__file__).resolve().parents[2]
    received: list[bytes] = []
    server = await aiohttp_server(capturing_live_server(received))
    url = str(server.make_url("/v1/live")).replace("http", "ws", 1)
    data = (shared_data / "jfk" / "jfk.flac").read_bytes()  # 11 s, 44.1 kHz stereo
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "livemeet", "stream", "-", "--url", url, "--speed", "1000", "--json",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root)},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(data), 60.0)
    assert proc.returncode == 0, err.decode()
    assert b"".join(received) == live_client.to_pcm16(decode_file(data))
    assert json.loads(out.splitlines()[-1])["type"] == "transcript.final"


def test_stream_dash_at_a_terminal_says_to_pipe_audio_in(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stream.sys, "stdin", namedtuple("Tty", "isatty")(lambda: True))
    assert main(["stream", "-"]) == 2
    err = capsys.readouterr().err
    assert "standard input, which is a terminal: pipe the audio in" in err


def test_stream_of_a_directory_says_it_is_one_as_transcribe_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stream /tmp` said "not an audio file, a damaged or truncated one, ...: FFmpeg: Is a
    directory" (a trial), where `transcribe /tmp` says plainly that it is a directory. Both
    name the path once, in front (transcribe said "/tmp: bad_audio: /tmp is a directory")."""
    assert main(["stream", str(tmp_path), "--url", "ws://127.0.0.1:9/v1/live"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}: bad_audio: a directory, not an audio file\n"
    with pytest.raises(BadAudio) as refused:
        transcribe.read_source(tmp_path)
    assert f"error: {tmp_path}: bad_audio: {refused.value.message}\n" == err


def test_stream_of_a_missing_file_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stream missing.wav` said "error: bad_audio: cannot read the audio file: No such file or
    directory", naming no file (a new user's trial); transcribe names it. A bad argument
    other than the file is not put under its name."""
    missing = tmp_path / "missing.wav"
    assert main(["stream", str(missing), "--url", "ws://127.0.0.1:9/v1/live"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: {missing}: bad_audio: cannot read the audio file: No such file or directory\n"
    )
    assert main(["stream", str(missing), "--url", "ftp://127.0.0.1:9/"]) == 2
    assert capsys.readouterr().err.startswith("error: invalid_request: ")


def test_ctrl_c_while_a_pipes_first_audio_is_awaited_stops_the_stream(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first audio is read before connecting; from a pipe whose writer has not written
    enough yet, PyAV's read dropped a Ctrl-C (its read callback ignores the exception and
    FFmpeg reads on), so the interrupt did nothing until the writer wrote or closed. The
    decoder here drops it the same way."""
    import livemeet.audio.decode

    reading, release = threading.Event(), threading.Event()

    def quiet_pipe(source: Any, max_audio_s: float) -> Iterator[npt.NDArray[np.float32]]:
        reading.set()
        while True:
            try:
                release.wait()
                break
            except KeyboardInterrupt:  # dropped, as PyAV's read callback drops it
                continue
        yield np.zeros(16_000, np.float32)

    def interrupt() -> None:
        if reading.wait(10.0):
            time.sleep(0.1)  # the wait has begun
            os.kill(os.getpid(), signal.SIGINT)
        release.wait(3.0)
        release.set()  # for the old code's read: a writer that writes at last

    monkeypatch.setattr(stream, "open_stream", lambda path: io.BytesIO())
    monkeypatch.setattr(livemeet.audio.decode, "iter_decode_stream", quiet_pipe)
    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    try:
        status = main(["stream", "-", "--url", "ws://127.0.0.1:18798/v1/live"])
    finally:
        release.set()
        interrupter.join()
    assert status == stream.INTERRUPTED_STATUS
    assert "interrupted before any audio was read" in capsys.readouterr().err


async def test_a_pipe_that_waits_neither_holds_back_events_nor_ctrl_c(
    aiohttp_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pipe's audio comes as its writer records it; read on the event loop, each wait for
    the next frame held back the server's events and Ctrl-C. Read on a thread (`PipeFrames`),
    `stop` ends the session while the read still waits: the final of what was sent comes,
    and `report` says how much was transcribed (a pipe cannot be resent), exit 130."""
    received: list[bytes] = []
    server = await aiohttp_server(capturing_live_server(received))
    url = str(server.make_url("/v1/live")).replace("http", "ws", 1)
    waiting, release = threading.Event(), threading.Event()

    def recording() -> Iterator[npt.NDArray[np.float32]]:
        yield np.zeros(16_000, np.float32)
        waiting.set()
        release.wait(30.0)  # a writer that has nothing more yet

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, lambda: waiting.wait(10.0) and loop.call_soon_threadsafe(stop.set))
    try:
        result = await asyncio.wait_for(
            live_client.stream_audio(url, recording(), speed=1e6, stop=stop, from_pipe=True), 10.0
        )
    finally:
        release.set()
    assert result.interrupted and result.stopped_early and result.sent_s == 1.0
    assert result.final is not None and len(b"".join(received)) == 32_000
    assert stream.report(result, None) == stream.INTERRUPTED_STATUS
    err = capsys.readouterr().err
    assert "stopped by Ctrl-C: the transcript covers 1.00 s of the audio read from standard " in err
    assert "resend" not in err


async def test_a_quiet_pipe_does_not_hold_the_stream_past_the_servers_close(
    aiohttp_server: Any,
) -> None:
    """The server ends the session (an error, then its close) while the pipe's writer has
    nothing more: the stream ends then, with the error, not once the writer writes again
    (which a recording paused, or a FIFO's idle writer, may never do)."""

    async def refuses_more(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "session.ready", "session_id": "s", "demo": True})
        async for msg in ws:
            if msg.type == web.WSMsgType.BINARY:
                error = {"code": "queue_full", "message": "busy", "retryable": True}
                await ws.send_json({"type": "error", **error})
                await ws.close(code=4429)
        return ws

    app = web.Application()
    app.router.add_get("/v1/live", refuses_more)
    server = await aiohttp_server(app)
    url = str(server.make_url("/v1/live")).replace("http", "ws", 1)
    release = threading.Event()

    def recording() -> Iterator[npt.NDArray[np.float32]]:
        yield np.zeros(8_000, np.float32)
        release.wait(30.0)  # a writer that has nothing more yet

    try:
        result = await asyncio.wait_for(
            live_client.stream_audio(url, recording(), hop_s=0.5, speed=1e6, from_pipe=True), 10.0
        )
    finally:
        release.set()
    assert result.error is not None and result.error["code"] == "queue_full"
    assert result.close_code == 4429 and result.stopped_early and result.sent_s == 0.5


async def test_a_pipe_whose_audio_fails_mid_way_sends_what_came_before(
    aiohttp_server: Any,
) -> None:
    """The decoder's error, raised on the pipe's thread, reaches the stream as a file's
    does: what decoded before it is sent and transcribed, and the error is the result's."""
    received: list[bytes] = []
    server = await aiohttp_server(capturing_live_server(received))
    url = str(server.make_url("/v1/live")).replace("http", "ws", 1)

    def damaged() -> Iterator[npt.NDArray[np.float32]]:
        yield np.zeros(8_000, np.float32)
        raise BadAudio("the stream is damaged")

    result = await asyncio.wait_for(
        live_client.stream_audio(url, damaged(), hop_s=0.5, speed=1e6, from_pipe=True), 10.0
    )
    assert isinstance(result.audio_error, BadAudio) and result.stopped_early
    assert result.sent_s == 0.5 and len(b"".join(received)) == 16_000
    assert result.final is not None and result.final["duration"] == 0.5


def test_frames_cut_chunks_as_the_whole_array_would_be_cut() -> None:
    x = np.arange(10_000, dtype=np.float32)
    sizes = [1, 2_999, 3_000, 3_001, 0, 999, 1]
    chunks = np.split(x, np.cumsum(sizes)[:-1])
    assert [f.tolist() for f in live_client.frames(chunks, 1_600)] == [
        x[i : i + 1_600].tolist() for i in range(0, 10_000, 1_600)
    ]
    assert list(live_client.frames([], 1_600)) == []


async def test_stream_takes_its_audio_as_it_sends_it(aiohttp_server: Any) -> None:
    """An endless source (a file of any length): the sender takes a chunk only when a frame
    needs it, so what it holds is bounded by a frame and a chunk, not by the file; a server
    that closes mid-way stops it."""
    received: list[bytes] = []

    async def closes_after_five_frames(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == web.WSMsgType.BINARY:
                received.append(msg.data)
                if len(received) == 5:
                    error = {"code": "queue_full", "message": "busy", "retryable": True}
                    await ws.send_json({"type": "error", **error})
                    await ws.close(code=4429)
        return ws

    pulled = 0

    def endless(chunk_samples: int) -> Iterator[npt.NDArray[np.float32]]:
        nonlocal pulled
        while True:
            pulled += chunk_samples
            yield np.zeros(chunk_samples, np.float32)

    url = await live_url(aiohttp_server, closes_after_five_frames)
    chunk_samples, frame_samples = 7_000, 16_000
    sending = live_client.stream_audio(url, endless(chunk_samples), speed=50.0)
    result = await asyncio.wait_for(sending, 10.0)
    assert result.close_code == 4429 and result.stopped_early
    sent = sum(len(b) for b in received) // 2
    assert sent == 5 * frame_samples and result.sent_s >= 5.0
    # sent, the frame it was about to send when it saw the close, and one partial chunk
    assert pulled <= result.sent_s * 16_000 + frame_samples + chunk_samples


async def test_stream_ends_what_decoded_when_the_file_turns_out_damaged(
    client: TestClient,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A file found damaged mid-way (decoded as it is sent, the damage shows only then): the
    audio before it is ended as by `end`, its transcript comes, and the error is reported
    with exit 1 (the work ran, partly)."""

    def damaged() -> Iterator[npt.NDArray[np.float32]]:
        yield np.zeros(24_000, np.float32)
        raise BadAudio("cannot decode the audio (truncated or corrupt?): libsndfile: ...")

    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    result = await live_client.stream_audio(url, damaged(), speed=100.0)
    assert result.final is not None and result.final["duration"] == 1.5
    assert result.audio_error is not None and result.stopped_early
    assert stream.report(result, tmp_path / "unused.flac") == 1
    err = capsys.readouterr().err
    assert "bad_audio: cannot decode the audio" in err and "after 1.50 s of audio" in err


# ---- Ctrl-C


@pytest.fixture
def sigint_guard() -> Iterator[list[str]]:
    """SIGINT while a test runs would stop pytest itself: record it instead, unless the code
    under test handles it (its loop's handler replaces this one while installed)."""
    seen: list[str] = []
    previous = signal.signal(signal.SIGINT, lambda *_: seen.append("unhandled SIGINT"))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


async def test_ctrl_c_ends_the_session_and_waits_for_the_final(
    client: TestClient,  # noqa: F811
    sigint_guard: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C closed the socket without `end`: the server drops such a session, so an hour
    streamed lost its whole transcript. Now a first Ctrl-C stops the audio, sends `end`,
    and the final comes; the exit status is 130 and stderr says where to resend from."""
    wav = write_wav(tmp_path / "ten.wav", 10.0)
    from livemeet.audio.decode import iter_decode

    url = str(client.make_url("/v1/live")).replace("http", "ws", 1)
    asyncio.get_running_loop().call_later(0.3, signal.raise_signal, signal.SIGINT)
    result = await stream.stream_interruptibly(url, iter_decode(wav), hop_s=0.1, speed=4.0)
    assert sigint_guard == []
    assert result is not None and result.interrupted and result.stopped_early
    assert result.final is not None and 0 < result.final["duration"] <= result.sent_s < 10.0
    assert stream.report(result, wav) == stream.INTERRUPTED_STATUS
    err = capsys.readouterr().err
    assert "waiting for the final transcript" in err
    covered = result.final["duration"]
    assert f"stopped by Ctrl-C: the transcript covers {covered:.2f} s of the 10.00 s file" in err
    assert f"resend from {covered:.2f} s" in err


async def test_a_second_ctrl_c_quits_without_the_final(
    aiohttp_server: Any, sigint_guard: list[str]
) -> None:
    async def never_final(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    url = await live_url(aiohttp_server, never_final)
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, signal.raise_signal, signal.SIGINT)
    loop.call_later(0.4, signal.raise_signal, signal.SIGINT)
    samples = np.zeros(16_000 * 60, np.float32)
    started = time.monotonic()
    assert await stream.stream_interruptibly(url, [samples]) is None
    assert time.monotonic() - started < 5.0 and sigint_guard == []
    # the handler is gone with the stream: a later SIGINT is the process's again
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_DFL


def test_stream_refuses_a_nan_hop_or_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = write_wav(tmp_path / "a.wav", 0.5)
    with pytest.raises(SystemExit) as exited:
        main(["stream", str(wav), "--hop-s", "nan"])
    assert exited.value.code == 2
    assert main(["stream", str(wav), "--speed", "nan"]) == 2
    assert "--speed must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("hop", ["0.0001", "0.019", "0", "-1", "32.8", "inf", "1e9", "x"])
def test_stream_refuses_a_hop_outside_the_protocols_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hop: str
) -> None:
    """--hop-s had no lower bound (0.0001 s sent one-sample frames, each paced by the server
    as 10 ms: a trial) and no upper one (frames over 1 MiB were split, unsaid): it is
    LIVE_MIN_FRAME_S (docs/protocol.md's shortest frame) to LIVE_MAX_FRAME_S (its largest)."""
    wav = write_wav(tmp_path / "a.wav", 0.5)
    with pytest.raises(SystemExit) as exited:
        main(["stream", str(wav), "--hop-s", hop])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --hop-s:" in err
    assert ("not a number" if hop == "x" else "outside 0.02..32.768 s") in err


@pytest.mark.parametrize("hop", ["0.02", "1", "32.768"])
def test_stream_takes_a_hop_inside_the_protocols_frames(hop: str) -> None:
    assert build_parser().parse_args(["stream", "a.wav", "--hop-s", hop]).hop_s == float(hop)
