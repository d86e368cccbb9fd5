"""An upload the server cannot take now is refused before its body is read
(openai_api.check_admission): every session slot in use or reserved by an upload on its way
(429), the backend not ready (503). A trial found a full server answered 429 only after
receiving and decoding the whole file, and counted that audio as audio in each time the
client's retries sent it again."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import QueueFull
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import METRICS_KEY
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber, SlottedFake
from tests.gateway.test_expect_continue import multipart, open_socket, read_response, request_head
from tests.gateway.test_incoming_uploads import URL, incoming, raw_upload_start, until
from tests.gateway.test_openai_api import form


async def slotted_client(
    aiohttp_client: ClientFactory, server_config: ServerConfig, free_slots: int
) -> tuple[TestClient, SlottedFake]:
    fake = SlottedFake(free_slots)
    return await aiohttp_client(create_app(server_config, fake)), fake


def upload_audio_seconds(client: TestClient) -> float:
    value = client.app[METRICS_KEY].registry.get_sample_value(
        "livemeet_audio_received_seconds_total", {"kind": "upload"}
    )
    return value or 0.0


async def answer_before_the_body(client: TestClient) -> tuple[int, dict[str, str], bytes]:
    """The server's answer to an upload's head with `Expect: 100-continue`, its body unsent
    (a `100 Continue` instead would come back as the status, 100)."""
    reader, writer = await open_socket(client)
    writer.write(request_head(len(multipart(wav_bytes(1.0))), {}))
    await writer.drain()
    try:
        return await asyncio.wait_for(read_response(reader), 5)
    finally:
        writer.close()


async def test_a_full_server_answers_429_before_the_body(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    client, fake = await slotted_client(aiohttp_client, server_config, free_slots=0)
    status, headers, answer = await answer_before_the_body(client)
    assert status == 429 and "retry-after" in headers
    assert json.loads(answer)["error"]["code"] == "queue_full"
    assert not fake.sessions


async def test_a_full_server_refuses_before_receiving_and_counts_no_audio(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """No Expect header (the openai client sends none): refused before the body is read,
    decoded or counted as an incoming upload, and its audio is not audio in."""
    client, fake = await slotted_client(aiohttp_client, server_config, free_slots=0)
    for _ in range(3):  # a client's retries
        resp = await client.post(URL, data=form(wav_bytes(2.0)))
        assert resp.status == 429
        assert "--max-sessions" in (await resp.json())["error"]["message"]
    assert fake.incoming_counts == []  # never counted: refused before the receive began
    assert upload_audio_seconds(client) == 0.0
    fake.free_slots = 1
    resp = await client.post(URL, data=form(wav_bytes(2.0)))
    assert resp.status == 200
    assert upload_audio_seconds(client) == 2.0


async def test_a_slot_is_held_for_an_upload_on_its_way(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """One free slot and one upload still sending its body: the next upload is refused at
    once rather than after its own body, only to find the slot taken when it opens."""
    client, fake = await slotted_client(aiohttp_client, server_config, free_slots=1)
    audio = wav_bytes(1.0)
    first = await raw_upload_start(client, audio, len(audio) // 2)
    await until(lambda: incoming(client).count == 1)
    resp = await client.post(URL, data=form(wav_bytes(1.0)))
    assert resp.status == 429
    first.close()
    await until(lambda: incoming(client).count == 0)
    resp = await client.post(URL, data=form(wav_bytes(1.0)))
    assert resp.status == 200


async def test_a_refused_open_counts_no_audio(client: TestClient, fake: FakeTranscriber) -> None:
    """The slot taken between the admission check and the open (a live session in between):
    the decoded audio was not transcribed, so it is not audio in."""
    fake.open_error = QueueFull("full")
    resp = await client.post(URL, data=form(wav_bytes(2.0)))
    assert resp.status == 429
    assert upload_audio_seconds(client) == 0.0


async def test_an_engine_not_ready_answers_503_before_the_body(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    fake = FakeTranscriber(start_ready=False)
    client = await aiohttp_client(create_app(server_config, fake))
    status, headers, answer = await answer_before_the_body(client)
    assert status == 503 and "retry-after" in headers
    assert json.loads(answer)["error"]["code"] == "engine_unavailable"
