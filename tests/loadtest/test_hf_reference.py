"""hf_reference on the tiny config (CPU): same weights in transformers, projected figures."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from livemeet.models.dialects import canonical_name
from livemeet.models.loader import load_model
from loadtest import hf_reference
from tests.loadtest.conftest import run_module


def test_hf_names_invert_the_loader_map() -> None:
    for ours in (
        "audio_encoder.layers.0.fc1.weight",
        "adaptor.linear_2.bias",
        "adaptor.norm.weight",
        "language_model.layers.3.mlp.up_proj.weight",
    ):
        assert canonical_name(hf_reference.hf_name(ours)) == ours
    with pytest.raises(KeyError):
        hf_reference.hf_name("lm_head.weight")


def test_reference_holds_livemeet_weights() -> None:
    ref, cfg = hf_reference.load_reference("tiny", "cpu", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(hf_reference.TINY_CONFIG))
        ours, _ = load_model(tmp, load_format="dummy", device="cpu", dtype="float32")
    theirs = ref.state_dict()
    for name, value in ours.state_dict().items():
        if "rotary" not in name:
            assert torch.equal(theirs[hf_reference.hf_name(name)], value), name
    assert ref.lm_head.weight.data_ptr() == ref.model.language_model.embed_tokens.weight.data_ptr()


@pytest.mark.slow
def test_tiny_projection_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "hf.json"
    proc = run_module(
        "loadtest.hf_reference",
        "--config",
        "tiny",
        "--contexts",
        "64,192",
        "--batches",
        "1,2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--long-audio-s",
        "30",
        "--json",
        str(out),
    )
    report = json.loads(out.read_text())
    assert "(projected)" in proc.stdout
    assert {(d["batch"]) for d in report["decode"]} == {1, 2}
    long, short = report["projections"]
    assert (long["workload"], long["batch"], long["output_tokens"]) == ("long", 1, 165)
    assert (short["workload"], short["batch"], short["output_tokens"]) == ("short", 2, 64)
    for p in (long, short):
        assert p["projected"] is True
        assert p["total_s"] == pytest.approx(p["encoder_s"] + p["prefill_s"] + p["decode_s"])
        assert p["audio_s_per_s"] == pytest.approx(p["batch"] * p["audio_s"] / p["total_s"])
