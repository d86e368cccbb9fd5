"""`livemeet stream` to a server with TLS (`serve --tls-cert/--tls-key`) whose certificate is
self-signed, made here with the openssl CLI: `--cacert` trusts it, as SSL_CERT_FILE does."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from livemeet.__main__ import main
from livemeet.cli import serve
from livemeet.config import ServerConfig
from livemeet.gateway.app import create_app
from tests.cli.test_cli import write_wav
from tests.gateway.conftest import fake, server_config  # noqa: F401  (fixtures)
from tests.gateway.fakes import FakeTranscriber


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem): a self-signed certificate for localhost and 127.0.0.1."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl CLI to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
async def tls_url(
    aiohttp_server: Any,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    self_signed: tuple[Path, Path],
) -> str:
    """The https:// address of a gateway serving TLS with the self-signed certificate, its
    context made as `serve` makes it."""
    cert, key = self_signed
    context = serve.ssl_context(replace(server_config, tls_cert=cert, tls_key=key))
    server = await aiohttp_server(create_app(server_config, fake), ssl=context)
    return f"https://localhost:{server.port}"


async def test_stream_trusts_a_self_signed_server_with_cacert_or_ssl_cert_file(
    tls_url: str,
    self_signed: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trial served --tls-cert with a self-signed certificate: `stream --url https://...`
    failed CERTIFICATE_VERIFY_FAILED, and only an undocumented SSL_CERT_FILE got through.
    `--cacert cert.pem` trusts it; without it the failure says so."""
    cert, _ = self_signed
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    wav = write_wav(tmp_path / "meeting.wav", 1.0)
    argv = ["stream", str(wav), "--url", tls_url, "--speed", "20"]

    assert await asyncio.to_thread(main, argv) == 2
    err = capsys.readouterr().err
    assert "CERTIFICATE_VERIFY_FAILED" in err and "--cacert FILE trusts it" in err

    assert await asyncio.to_thread(main, [*argv, "--cacert", str(cert)]) == 0
    assert "# transcript.final: " in capsys.readouterr().out

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # OpenSSL's own way, as documented
    assert await asyncio.to_thread(main, argv) == 0


async def test_plain_http_to_a_tls_server_says_it_speaks_tls(
    tls_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url http://...` to `serve --tls-cert` said only "did not receive a valid HTTP
    response" (a new user's trial); the reverse mistake already said what to do."""
    wav = write_wav(tmp_path / "meeting.wav", 0.1)
    url = tls_url.replace("https://", "http://")
    assert await asyncio.to_thread(main, ["stream", str(wav), "--url", url]) == 2
    err = capsys.readouterr().err
    assert "did not receive a valid HTTP response" in err
    assert "speaks TLS: its URL is wss:// or https://" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("cacert", "url", "message"),
    [
        ("missing.pem", "https://localhost:1", "cannot load --cacert {path}: No such file"),
        ("not-a-cert.pem", "https://localhost:1", "cannot load --cacert {path}: "),
        ("key.pem", "wss://localhost:1", "cannot load --cacert {path}: "),  # a key, no cert
        ("cert.pem", "http://localhost:1", "--cacert is for a wss:// or https:// --url"),
    ],
)
def test_a_cacert_that_cannot_be_used_exits_2_before_connecting(
    self_signed: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cacert: str,
    url: str,
    message: str,
) -> None:
    (tmp_path / "not-a-cert.pem").write_text("hello\n")
    path = tmp_path / cacert
    wav = write_wav(tmp_path / "meeting.wav", 0.1)
    assert main(["stream", str(wav), "--url", url, "--cacert", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config_error: ") and message.format(path=path) in err, err
    assert err.count("\n") == 1 and "cannot connect" not in err
