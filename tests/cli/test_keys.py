"""API keys from the command line: `livemeet keys create|list|revoke`, `serve --auth` and what
`--check-config` says of it, and `stream --api-key`."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from livemeet.__main__ import build_parser, main
from livemeet.cli import live_client, serve, stream
from livemeet.config import AuthMode, ServerConfig
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import SESSIONS_KEY
from tests.cli.test_cli import write_wav
from tests.cli.test_stream_resume import proxy_for, stream_a_second_in  # noqa: F401
from tests.gateway.conftest import ClientFactory, fake, server_config  # noqa: F401
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_ws_live import wait_until

KEY = re.compile(r"lm_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")


def keys(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, str, str]:
    """`livemeet keys ARGS --data-dir DATA_DIR`: its exit status, stdout and stderr."""
    status = main(["keys", *args, "--data-dir", str(data_dir)])
    out, err = capsys.readouterr()
    return status, out, err


def test_keys_create_prints_the_key_alone_and_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    status, out, err = keys(capsys, data, "create", "--name", "ci")
    assert status == 0
    match = KEY.fullmatch(out.strip())  # alone on stdout: KEY=$(livemeet keys create)
    assert match is not None, out
    key_id = match.group(1)
    assert f"API key {key_id} (ci) created" in err and "only this once" in err
    assert "first key" in err and "--auth auto" in err
    assert out.strip() not in err
    status, out, err = keys(capsys, data, "create", "--json")
    record = json.loads(out)
    assert KEY.fullmatch(record["key"]) and record["id"] != key_id and record["name"] == ""
    assert record["active"] is True and record["revoked_at"] is None
    assert "first key" not in err
    assert ApiKeyStore(store_path(data)).ring().num_active == 2


def test_keys_list_shows_ids_names_and_dates_never_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    status, out, err = keys(capsys, data, "list")
    assert status == 0 and out == "" and "no API keys in" in err
    assert not store_path(data).exists()  # listing makes nothing
    made = [keys(capsys, data, "create", "--name", name)[1].strip() for name in ("ci", "bob")]
    ids = [KEY.fullmatch(key).group(1) for key in made]  # type: ignore[union-attr]
    keys(capsys, data, "revoke", ids[0])
    status, out, err = keys(capsys, data, "list")
    assert status == 0
    header, first, second = out.splitlines()
    assert header.split() == ["ID", "NAME", "CREATED", "REVOKED"]
    assert first.startswith(f"{ids[0]}  ci ") and "UTC" in first.split("ci", 1)[1]
    assert second.startswith(f"{ids[1]}  bob") and second.rstrip().endswith("-")
    for key in made:
        assert key not in out and key.split("_", 2)[2] not in out
    status, out, _ = keys(capsys, data, "list", "--json")
    listed = json.loads(out)
    assert [(k["id"], k["name"], k["active"]) for k in listed] == [
        (ids[0], "ci", False),
        (ids[1], "bob", True),
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed[0]["revoked_at"])
    assert not any(key in out for key in made)


def test_keys_revoke_by_id_or_key_and_its_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    key = keys(capsys, data, "create", "--name", "ci")[1].strip()
    key_id = key.split("_")[1]
    # a key that only carries the id is not the key (it revoked it: a trial); nothing changes
    wrong = f"lm_{key_id}_WRONG"
    status, out, err = keys(capsys, data, "revoke", wrong)
    assert status == 2 and out == ""
    assert err.startswith(f"error: invalid_request: that is not API key {key_id}")
    assert "nothing was revoked" in err and "WRONG" not in err and err.count("\n") == 1
    assert ApiKeyStore(store_path(data)).ring().num_active == 1
    status, out, err = keys(capsys, data, "revoke", key)  # the key itself: its id is revoked
    assert status == 0 and f"API key {key_id} (ci) revoked" in out
    assert key not in out + err
    assert "no active key is left" in err
    status, out, _ = keys(capsys, data, "revoke", key_id)
    assert status == 0 and "revoked already" in out
    status, out, err = keys(capsys, data, "revoke", "0" * 12)
    assert status == 2 and out == ""
    assert err.strip() == f"error: not_found: no API key '{'0' * 12}' in {store_path(data)}"
    status, _, err = keys(capsys, data, "revoke", "lm_nonsense_secret")
    assert status == 2 and err.startswith("error: invalid_request: not a key id")
    assert "nonsense" not in err  # what looks like a key is not echoed
    status, _, err = keys(capsys, data, "create", "--name", "a\nb")
    assert status == 2 and err.count("\n") == 1 and "control characters" in err


def test_keys_on_a_data_dir_that_is_a_file_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keys list --data-dir FILE` said "no API keys in FILE/api_keys.sqlite3", exit 0 (a CLI
    trial): no store can be there, which is not a store without keys."""
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("a file")
    for data_dir, args in (
        (not_a_dir, ("list",)),
        (not_a_dir, ("list", "--json")),
        (not_a_dir, ("create", "--name", "ci")),
        (not_a_dir, ("revoke", "0" * 12)),
        (not_a_dir / "deeper", ("list",)),
    ):
        status, out, err = keys(capsys, data_dir, *args)
        assert status == 2 and out == "", args
        assert err == (
            f"error: config_error: cannot open the API key store {store_path(data_dir)}: "
            f"{not_a_dir} is not a directory (--data-dir names the server's data directory)\n"
        )
    assert not_a_dir.read_text() == "a file"
    # a data directory not made yet is still no keys, and `create` makes it
    status, _, err = keys(capsys, tmp_path / "new", "list")
    assert status == 0 and "no API keys in" in err


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("", "--name is empty"),
        ("   ", "--name is empty"),
        ("\t", "--name is empty"),  # whitespace: stripped to nothing
        ("a\tb", "control characters"),
        ("a\x00b", "control characters"),
        ("a\u202eb", "bidirectional"),
        ("x" * 65, "at most 64 characters, not 65"),
    ],
)
def test_keys_create_refuses_an_empty_or_unprintable_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, needle: str
) -> None:
    """`keys create --name ""` made a key without a name (a CLI trial: an unset --name "$WHO"),
    which leaving --name out does on purpose."""
    data = tmp_path / "data"
    status, out, err = keys(capsys, data, "create", "--name", name)
    assert status == 2 and out == "" and needle in err and err.count("\n") == 1
    assert not store_path(data).exists()  # nothing was made
    status, out, _ = keys(capsys, data, "create", "--name", "x" * 64)
    assert status == 0 and KEY.fullmatch(out.strip())


def test_keys_take_the_data_dir_serve_uses_by_default() -> None:
    parser = build_parser()
    for action in (["create"], ["list"], ["revoke", "0" * 12]):
        args = parser.parse_args(["keys", *action])
        assert args.data_dir == ServerConfig.data_dir
    assert parser.parse_args(["serve"]).data_dir == ServerConfig.data_dir


def test_serve_auth_flag(tmp_path: Path) -> None:
    def config(*flags: str) -> ServerConfig:
        args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags])
        return serve.config_from_args(args)

    assert config().gateway.auth is AuthMode.AUTO
    assert config("--auth", "keys").gateway.auth is AuthMode.KEYS
    assert config("--auth", "off").gateway.auth is AuthMode.OFF
    with pytest.raises(SystemExit):
        config("--auth", "on")


def test_check_config_says_who_may_use_the_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"

    def check(*flags: str) -> str:
        caplog.clear()
        base = ["serve", "--data-dir", str(data), "--check-config"]
        with caplog.at_level("INFO"):
            assert serve.run(build_parser().parse_args([*base, *flags])) == 0
        return caplog.text

    assert "auth auto: no API key in the store, so the API is open" in check()
    assert "THE API IS OPEN" not in check()  # 127.0.0.1
    assert "THE API IS OPEN" in check("--host", "0.0.0.0")
    assert "nobody can use the API" in check("--auth", "keys")
    assert "anyone who can reach the server" in check("--auth", "off")
    key_id = keys(capsys, data, "create")[1].split("_")[1]
    assert "auth auto: API keys required (1 active API key, 0 revoked)" in check()
    assert "THE API IS OPEN" not in check("--host", "0.0.0.0")
    keys(capsys, data, "revoke", key_id)
    text = check()
    assert "auth auto: API keys required, and none is active" in text and "WARNING" in text


def test_the_advice_to_close_the_api_names_the_servers_data_dir(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start log and the open-API warning said "the first `livemeet keys create` closes
    it": run from another directory, that made a key in its own ./livemeet-data and the server
    stayed open (a trial). The command given names the server's data dir, absolute. Under
    `--auth off` a key changes nothing: with keys in the store, the advice is to drop it."""
    monkeypatch.chdir(tmp_path)
    data = Path("served data")  # relative, and quoted for a shell
    create = f"`livemeet keys create --data-dir '{tmp_path / data}'`"

    def check(*flags: str) -> str:
        caplog.clear()
        base = ["serve", "--data-dir", str(data), "--check-config", "--host", "0.0.0.0"]
        with caplog.at_level("INFO"):
            assert serve.run(build_parser().parse_args([*base, *flags])) == 0
        return caplog.text

    text = check()
    assert f"the first {create} closes it" in text
    assert f"make a key ({create}), or listen on 127.0.0.1" in text
    text = check("--auth", "off")
    assert f"make a key ({create}) and start the server without `--auth off`" in text
    assert keys(capsys, data, "create")[0] == 0
    text = check("--auth", "off")
    assert "THE API IS OPEN" in text and "make a key" not in text
    assert "start the server without `--auth off` (its data dir holds active API keys)" in text
    [record] = json.loads(keys(capsys, data, "list", "--json")[1])
    text = check("--auth", "keys")
    assert "API keys required (1 active" in text
    assert keys(capsys, data, "revoke", record["id"])[2].count(create) == 1
    assert f"nobody can use the API until {create} makes one" in check("--auth", "keys")


def test_auth_off_starts_over_a_key_store_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --auth off` over a corrupt api_keys.sqlite3 exited 2 "cannot read the API key
    store" (a trial), though off never uses a key: it is the way back into a server whose
    store broke. It warns and goes on; the modes that use keys still refuse to start."""
    data = tmp_path / "data"
    data.mkdir()
    store_path(data).write_bytes(b"not a database, but long enough to be read as one" * 100)
    base = ["serve", "--data-dir", str(data), "--check-config"]
    with caplog.at_level("INFO"):
        assert serve.run(build_parser().parse_args([*base, "--auth", "off"])) == 0
    assert "cannot read the API key store" in caplog.text and "--auth off" in caplog.text
    assert "configuration ok" in caplog.text
    caplog.clear()
    for mode in ("auto", "keys"):
        assert serve.run(build_parser().parse_args([*base, "--auth", mode])) == 2
        assert "cannot read the API key store" in caplog.text


async def test_the_start_log_warns_of_an_open_server_on_a_reachable_host(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("INFO"):
        config = ServerConfig(host="0.0.0.0", data_dir=tmp_path / "data")
        await aiohttp_client(create_app(config, FakeTranscriber()))
    assert "auth auto: no API key in the store" in caplog.text
    assert "THE API IS OPEN" in caplog.text and "0.0.0.0" in caplog.text
    assert f"make a key (`livemeet keys create --data-dir {tmp_path / 'data'}`)" in caplog.text


# -- stream --api-key ---------------------------------------------------------------------


@pytest.fixture
def made_key(server_config: ServerConfig) -> str:  # noqa: F811
    store = ApiKeyStore(store_path(server_config.data_dir))
    _, key = store.create("stream")
    store.close()
    return key


@pytest.fixture
async def keyed(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    made_key: str,
) -> TestClient:
    return await aiohttp_client(create_app(server_config, fake))


def live_url(client: TestClient) -> str:
    return str(client.make_url("/v1/live")).replace("http", "ws", 1)


async def test_stream_sends_its_api_key_on_the_upgrade(keyed: TestClient, made_key: str) -> None:
    samples = (0.1 * np.sin(np.arange(16000) / 10)).astype(np.float32)
    result = await live_client.stream_samples(
        live_url(keyed), samples, speed=20.0, api_key=made_key
    )
    assert result.close_code == 1000 and result.final is not None
    refused = await live_client.stream_samples(live_url(keyed), samples, speed=20.0)
    assert refused.close_code == 4401 and refused.final is None
    assert refused.error is not None and refused.error["code"] == "unauthorized"


def test_a_refused_key_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = write_wav(tmp_path / "a.wav", 1.0)
    error = {"type": "error", "code": "unauthorized", "message": "the API key is not one of"}

    async def refusing(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        return live_client.StreamResult([error], [0.0], 4401)

    monkeypatch.setattr(stream, "stream_audio", refusing)
    assert main(["stream", str(wav), "--api-key", "lm_wrong"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: the server refused the session: unauthorized: the API key is not one of "
        "(close code 4401; --api-key or LIVEMEET_API_KEY)"
    )
    assert "lm_wrong" not in err


def test_stream_takes_its_key_from_the_flag_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wav = write_wav(tmp_path / "a.wav", 1.0)
    given: list[str | None] = []

    async def server(url: str, chunks: Any, **kwargs: Any) -> live_client.StreamResult:
        given.append(kwargs["api_key"])
        final = {"type": "transcript.final", "duration": 1.0}
        return live_client.StreamResult([final], [0.0], 1000, sent_s=1.0)

    monkeypatch.setattr(stream, "stream_audio", server)
    monkeypatch.delenv("LIVEMEET_API_KEY", raising=False)
    assert main(["stream", str(wav)]) == 0
    monkeypatch.setenv("LIVEMEET_API_KEY", "lm_from_env")
    assert main(["stream", str(wav)]) == 0
    assert main(["stream", str(wav), "--api-key", "lm_from_flag"]) == 0
    assert given == [None, "lm_from_env", "lm_from_flag"]
    help_text = build_parser().parse_args(["stream", str(wav)])  # the env is not the default
    assert help_text.api_key is None


async def test_stream_sends_its_key_again_when_it_resumes(
    keyed: TestClient,
    fake: FakeTranscriber,  # noqa: F811
    made_key: str,
    proxy_for: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LIVEMEET_API_KEY", made_key)
    proxy, url = await proxy_for(keyed)
    running = await stream_a_second_in(url, tmp_path, fake)
    proxy.drop()
    assert await asyncio.wait_for(running, 10) == 0
    assert proxy.num_connections == 2 and len(fake.sessions) == 1  # resumed, not refused
    await wait_until(lambda: len(keyed.app[SESSIONS_KEY]) == 0)
