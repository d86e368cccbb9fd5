"""`livemeet transcribe --model <tiny checkpoint>` on every speech file of the shared data: it
runs end to end (decode, worker thread, paged engine, writers), and each prompt carries exactly
as many audio tokens as the transformers processor gives for the same samples."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from livemeet.__main__ import main
from livemeet.audio.constants import (
    KV_BLOCK_SIZE,
    LIVE_DECODE_STEPS,
    LIVE_FORCED_BUDGET_SLOW_FRACTION,
    LIVE_FORCED_TRANSCRIPT_MIN_TOKENS,
    LIVE_FORCED_TRANSCRIPT_TOKENS,
    LIVE_STEP_BUDGET_S,
    UPLOAD_BATCH_WAIT_S,
    UPLOAD_MIN_SHARE,
    UPLOAD_STEP_BUDGET_S,
)
from livemeet.audio.decode import decode_file
from livemeet.engine.cost_model import StepCostModel
from livemeet.models.prompt import AUDIO_PAD
from livemeet.models.tokenizer import load_tokenizer
from livemeet.session.forced_budget import ForcedBudget
from tests.models import tiny


@pytest.fixture(scope="module")
def moss_dir(upstream_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint plus the tokenizer.json a real checkpoint ships."""
    root = tmp_path_factory.mktemp("moss_ckpt") / "tiny-moss"
    shutil.copytree(upstream_dir, root)
    load_tokenizer(None).save(str(root / "tokenizer.json"))
    return root


@pytest.mark.slow
def test_transcribe_every_shared_file(
    moss_dir: Path, shared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.models.reference import make_reference_processor

    files = tiny.speech_files(shared_data)
    assert len(files) >= 5
    out = tmp_path / "out"
    caplog.set_level(logging.INFO, logger="livemeet.backends.moss")
    argv = ["transcribe", *map(str, files), "--model", str(moss_dir), "--format", "json"]
    argv += ["--output", str(out), "--device", "cpu", "--dtype", "float32"]
    argv += ["--max-new-tokens", "3", "--num-kv-blocks", "1024", "--no-progress"]
    assert main(argv) == 0
    for path in files:
        body = json.loads((out / (path.stem + ".json")).read_text())
        assert isinstance(body["text"], str)
    records = [r for r in caplog.records if hasattr(r, "num_audio_tokens")]
    assert len(records) == len(files)
    processor = make_reference_processor()
    for path, record in zip(files, records, strict=True):
        samples = decode_file(path)
        assert record.num_samples == len(samples), path
        inputs = processor.apply_transcription_request(samples, return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        assert record.num_audio_tokens == ids.count(AUDIO_PAD), path
        assert record.num_prompt_tokens == len(ids), path


def test_transcribe_rejects_a_missing_forced_output(moss_dir: Path, tmp_path: Path) -> None:
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"")
    argv = ["transcribe", str(wav), "--model", str(moss_dir)]
    assert main([*argv, "--forced-output", str(tmp_path / "missing.txt")]) == 2


def test_serve_model_flags(tmp_path: Path) -> None:
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve

    forced = tmp_path / "ref.txt"
    forced.write_text("[0.00][S01] hi[1.00]")
    args = build_parser().parse_args(
        ["serve", "--load-format", "dummy", "--forced-output", str(forced), "--dtype", "bfloat16"]
    )
    config = serve.config_from_args(args)
    assert config.model.backend_name == "moss"
    assert config.model.forced_output == str(forced) and config.model.dtype == "bfloat16"
    args = build_parser().parse_args(["serve", "--model", "x", "--kv-cache-dtype", "fp8_e4m3"])
    assert serve.config_from_args(args).model.kv_cache_dtype == "fp8_e4m3"
    assert serve.config_from_args(args).model.kv_block_size == KV_BLOCK_SIZE  # the default
    args = build_parser().parse_args(["serve", "--model", "x", "--kv-block-size", "32"])
    assert serve.config_from_args(args).model.kv_block_size == 32
    with pytest.raises(SystemExit):  # a size no attention kernel pages by
        build_parser().parse_args(["serve", "--model", "x", "--kv-block-size", "24"])
    assert serve.config_from_args(args).model.prefill_graphs  # on unless turned off
    args = build_parser().parse_args(["serve", "--model", "x", "--no-prefill-graphs"])
    assert not serve.config_from_args(args).model.prefill_graphs
    # a one-shot transcribe does not pay the captures unless asked to
    args = build_parser().parse_args(["transcribe", "a.wav", "--model", "x"])
    assert not serve.model_config_from_args(args).prefill_graphs
    args = build_parser().parse_args(["transcribe", "a.wav", "--model", "x", "--prefill-graphs"])
    assert serve.model_config_from_args(args).prefill_graphs


def test_transcribe_has_no_serving_flags_and_takes_their_defaults() -> None:
    """The scheduling flags (uploads beside live sessions) are `serve`'s: `transcribe --help`
    listed them (a user trial); its ModelConfig has their defaults."""
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve
    from livemeet.config import ModelConfig

    args = build_parser().parse_args(["transcribe", "a.wav", "--model", "x"])
    config = serve.model_config_from_args(args)
    defaults = ModelConfig(model="x")
    assert all(getattr(config, f) == getattr(defaults, f) for f in serve.SCHEDULING_FIELDS)
    for flag in ("--live-vad", "--live-decode-steps=0", "--upload-hold=arrivals"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["transcribe", "a.wav", flag])
    args = build_parser().parse_args(["serve", "--model", "x", "--no-live-vad"])
    assert not serve.config_from_args(args).model.live_vad  # serve still has them all
    assert all(hasattr(args, f) for f in serve.SCHEDULING_FIELDS)


def test_serve_live_vad_flag_picks_the_detector_or_none() -> None:
    """--live-vad webrtc|silero picks the live VAD (bare: the default, WebRTC by the
    measurement in loadtest/vad_study.py); --no-live-vad turns it off; other names are
    refused by argparse and by validate()."""
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve
    from livemeet.config import ModelConfig
    from livemeet.errors import ConfigError
    from livemeet.session.vad import LiveVad

    def live_vad(*flags: str) -> LiveVad | None:
        args = build_parser().parse_args(["serve", "--model", "x", *flags])
        return serve.config_from_args(args).model.live_vad

    assert ModelConfig().live_vad is LiveVad.WEBRTC
    assert live_vad() is LiveVad.WEBRTC
    assert live_vad("--live-vad") is LiveVad.WEBRTC
    assert live_vad("--live-vad", "silero") is LiveVad.SILERO
    assert live_vad("--live-vad=webrtc") is LiveVad.WEBRTC
    assert live_vad("--no-live-vad") is None
    assert live_vad("--live-vad", "silero", "--no-live-vad") is None  # the last one wins
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        live_vad("--live-vad", "pyannote")
    with pytest.raises(ConfigError, match="--live-vad must be one of webrtc, silero"):
        ModelConfig(live_vad="pyannote").validate()  # type: ignore[arg-type]
    ModelConfig(live_vad="silero").validate()  # type: ignore[arg-type]  # as Python may pass it


def test_serve_engine_sizing_flags() -> None:
    """--mem-fraction, --chunked-prefill-size and the upload hold flags reach the ModelConfig
    and are validated."""
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve
    from livemeet.config import ModelConfig, UploadHold
    from livemeet.errors import ConfigError

    args = build_parser().parse_args(["serve", "--model", "x"])
    config = serve.config_from_args(args).model
    assert config.mem_fraction == 0.85 and config.chunked_prefill_size == 4096
    args = build_parser().parse_args(
        ["serve", "--model", "x", "--mem-fraction", "0.5", "--chunked-prefill-size", "512"]
    )
    config = serve.config_from_args(args).model
    assert config.mem_fraction == 0.5 and config.chunked_prefill_size == 512
    assert config.upload_batch_wait_ms == 1000.0 * UPLOAD_BATCH_WAIT_S == 100.0
    args = build_parser().parse_args(["serve", "--model", "x", "--upload-batch-wait-ms", "0"])
    assert serve.config_from_args(args).model.upload_batch_wait_ms == 0.0
    assert config.upload_hold == UploadHold.PIPELINE
    assert config.upload_step_budget_ms == 1000.0 * UPLOAD_STEP_BUDGET_S == 200.0
    args = build_parser().parse_args(["serve", "--model", "x", "--upload-step-budget-ms", "80"])
    assert serve.config_from_args(args).model.upload_step_budget_ms == 80.0
    assert config.upload_min_share == UPLOAD_MIN_SHARE == 0.25
    args = build_parser().parse_args(["serve", "--model", "x", "--upload-min-share", "0"])
    assert serve.config_from_args(args).model.upload_min_share == 0.0
    assert config.live_step_budget_ms == 1000.0 * LIVE_STEP_BUDGET_S == 15.0
    args = build_parser().parse_args(["serve", "--model", "x", "--live-step-budget-ms", "16"])
    assert serve.config_from_args(args).model.live_step_budget_ms == 16.0
    args = build_parser().parse_args(["serve", "--model", "x", "--live-step-budget-ms", "50"])
    assert serve.config_from_args(args).model.live_step_budget_ms == 50.0  # the old default
    assert config.live_decode_steps == LIVE_DECODE_STEPS == 0
    args = build_parser().parse_args(["serve", "--model", "x", "--live-decode-steps", "2"])
    assert serve.config_from_args(args).model.live_decode_steps == 2  # the old default
    assert config.live_forced_transcript_tokens == LIVE_FORCED_TRANSCRIPT_TOKENS == 2048
    args = build_parser().parse_args(
        ["serve", "--model", "x", "--live-forced-transcript-tokens", "0"]
    )
    assert serve.config_from_args(args).model.live_forced_transcript_tokens == 0
    assert config.live_forced_transcript_min_tokens == LIVE_FORCED_TRANSCRIPT_MIN_TOKENS == 128
    args = build_parser().parse_args(
        ["serve", "--model", "x", "--live-forced-transcript-min-tokens", "2048"]  # fixed
    )
    assert serve.config_from_args(args).model.live_forced_transcript_min_tokens == 2048
    assert config.live_hop_load == LIVE_FORCED_BUDGET_SLOW_FRACTION == 0.2
    args = build_parser().parse_args(["serve", "--model", "x", "--live-hop-load", "0.3"])
    assert serve.config_from_args(args).model.live_hop_load == 0.3  # the old default
    args = build_parser().parse_args(["serve", "--model", "x", "--upload-hold", "arrivals"])
    assert serve.config_from_args(args).model.upload_hold is UploadHold.ARRIVALS
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        build_parser().parse_args(["serve", "--model", "x", "--upload-hold", "always"])
    with pytest.raises(ConfigError):
        ModelConfig(upload_hold="always").validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="auto, fp8_e4m3"):
        ModelConfig(kv_cache_dtype="int8").validate()
    for bad in (
        ["--mem-fraction", "0.97"],  # leaves too little for graphs and activations
        ["--mem-fraction", "0"],
        ["--chunked-prefill-size", "8"],  # below MIN_PREFILL_CHUNK: non-final chunks would stall
        ["--chunked-prefill-size", "200000"],  # past the context
        ["--upload-batch-wait-ms", "-1"],
        ["--upload-batch-wait-ms", "5000"],  # holding an upload for seconds is never right
        ["--upload-step-budget-ms", "20"],  # below the longest live step (50 ms)
        ["--upload-step-budget-ms", "300"],  # three such steps would outlast a live hop
        ["--live-step-budget-ms", "2"],  # the fixed cost of a step would dominate it
        ["--live-step-budget-ms", "80"],  # longer than a flush window
        ["--live-decode-steps", "-1"],
        ["--live-decode-steps", "9"],  # prefill would wait on a run of decode steps
        ["--live-forced-transcript-min-tokens", "-1"],
        ["--live-forced-transcript-min-tokens", "100"],  # adaptive, but would hold no segment
        ["--live-forced-transcript-tokens", "-1"],
        ["--live-forced-transcript-tokens", "200000"],  # past the context
        ["--live-hop-load", "0"],  # every hop would halve the budget
        ["--live-hop-load", "1e-320"],  # the same in effect (a fresh-eyes review)
        ["--live-hop-load", "1.5"],  # hops could never be slower than that: never halves
    ):
        args = build_parser().parse_args(["serve", "--model", "x", *bad])
        with pytest.raises(ConfigError):
            serve.config_from_args(args)


def test_engine_sizing_reaches_the_engine(moss_dir: Path) -> None:
    from livemeet.backends.moss import MossCore
    from livemeet.config import ModelConfig, UploadHold

    core = MossCore(
        ModelConfig(
            model=str(moss_dir), device="cpu", dtype="float32", num_kv_blocks=64,
            mem_fraction=0.6, chunked_prefill_size=16_384, upload_batch_wait_ms=20,
            upload_hold=UploadHold.ARRIVALS, upload_step_budget_ms=120, kv_cache_dtype="fp8_e4m3",
            live_step_budget_ms=20, live_decode_steps=3, live_hop_load=0.35,
        )
    )  # fmt: skip
    core.load()
    try:
        assert core.engine is not None
        assert core.engine.config.mem_fraction == 0.6
        sched = core.engine.scheduler.config
        assert sched.chunked_prefill_size == 16_384 and sched.max_num_batched_tokens == 16_384
        assert sched.upload_batch_wait_s == 0.02 and sched.upload_hold is UploadHold.ARRIVALS
        assert sched.upload_step_budget_s == 0.12 and sched.step_budget_s == 0.02
        assert sched.live_decode_steps == 3
        assert core.forced_budget == ForcedBudget.for_hop_load(2_048, 128, 0.35)
        cost = core.engine.scheduler.cost_model
        assert cost == StepCostModel.for_kv_cache("fp8_e4m3") != StepCostModel()
    finally:
        core.close()


def test_serve_gateway_limits_reach_the_config() -> None:
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve
    from livemeet.errors import ConfigError

    args = build_parser().parse_args(["serve", "--max-concurrent-decodes", "6"])
    assert serve.config_from_args(args).gateway.max_concurrent_decodes == 6
    default = serve.config_from_args(build_parser().parse_args(["serve"]))
    assert default.gateway.max_concurrent_decodes == 2
    with pytest.raises(ConfigError):
        serve.config_from_args(
            build_parser().parse_args(["serve", "--max-concurrent-decodes", "0"])
        )
