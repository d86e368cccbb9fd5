"""Config parsing (both dialects) and checkpoint loading, including every error path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from livemeet.errors import ConfigError
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.loader import load_model
from tests.denied import deny_access
from tests.models import tiny

REAL_PARAMS = 908_513_280  # MODEL.md section 0


def test_both_config_dialects_parse_to_the_same_geometry(upstream_dir: Path, hf_dir: Path) -> None:
    assert MossTDConfig.from_file(upstream_dir / "config.json") == tiny.TINY
    assert MossTDConfig.from_file(hf_dir / "config.json") == tiny.TINY


def test_real_size_geometry_has_the_published_parameter_count() -> None:
    cfg = MossTDConfig.real_size()
    with torch.device("meta"):
        model = MossTDModel(cfg)
    assert sum(p.numel() for p in model.parameters()) == REAL_PARAMS
    assert cfg.adaptor_input_dim == 4096 and cfg.text.heads * cfg.text.head_dim == 2048
    hf = tiny.hf_config(cfg).to_dict()
    assert MossTDConfig.from_dict(hf) == cfg
    assert MossTDConfig.from_dict(tiny.upstream_config_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(model_type="whisper"), "model_type"),
        (lambda c: c.update(adaptor_input_dim=1000), "adaptor_input_dim"),
        (lambda c: c["audio_config"].pop("d_model"), "d_model"),
        # was "model config field 'hidden_size' must be an integer, got None": no section, and
        # not saying it is missing (a trial)
        (lambda c: c["text_config"].pop("hidden_size"), "text_config needs 'hidden_size'"),
        (lambda c: c["text_config"].update(num_key_value_heads=3), "multiple"),
        # said "not a multiple of 32" alone: where 32 came from was the reader's guess (a trial)
        (lambda c: c["text_config"].pop("num_key_value_heads"), "default 32 where left out"),
        (lambda c: c["text_config"].update(num_hidden_layers=0), "need >= 1 layer"),
        (lambda c: c["text_config"].update(head_dim=7), "even for RoPE"),
        (lambda c: c["text_config"].update(rope_scaling={"rope_type": "yarn"}), "yarn"),
        (lambda c: c.pop("text_config"), "text_config"),
        # geometry the front end can't run was accepted, then crashed the engine worker
        # (mel bins, window frames) or used part of the audio (merge 2); found by a trial
        (lambda c: c["audio_config"].update(num_mel_bins=128), "num_mel_bins 128"),
        (lambda c: c["audio_config"].update(max_source_positions=1000), "positions 1000"),
        (lambda c: (c.update(audio_merge_size=2), c.pop("adaptor_input_dim")), "merge_size 2"),
        # the adaptor's activation was ignored: SiLU ran whatever config.json said
        (lambda c: c.update(projector_hidden_act="gelu"), "projector_hidden_act"),
        (lambda c: c.update(projector_bias=False), "projector_bias"),
        # zero heads raised ZeroDivisionError, not a config error
        (lambda c: c["text_config"].update(num_attention_heads=0), "text heads 0"),
        (lambda c: c["text_config"].update(num_key_value_heads=0), "text kv_heads 0"),
        (lambda c: c["audio_config"].update(encoder_attention_heads=0), "audio heads 0"),
        (lambda c: c["text_config"].update(rope_theta="big"), "rope_theta"),
        (lambda c: c["text_config"].update(rms_norm_eps=-1.0), "rms_norm_eps"),
        # prompts put the audio at <|audio_pad|> (151671) whatever the config said: another id
        # was served without a word, where the reference looks for the audio at that id (a trial)
        (lambda c: c.update(audio_token_id=151_670), "audio_token_id 151670 is not"),
        # layer_types was never read: a list longer than the layers (transformers refuses it) or
        # naming sliding layers (the reference fails on them) ran as full attention (a trial)
        (lambda c: c["text_config"].update(layer_types=["full_attention"] * 4), "lists 4 layers"),
        (
            lambda c: c["text_config"].update(layer_types=["sliding_attention"] * 3),
            "'sliding_attention'",
        ),
        # both were refused as "text attention_bias / sliding windows are unsupported", naming
        # neither field (a trial)
        (lambda c: c["text_config"].update(attention_bias=True), "attention_bias true"),
        # "false" was read as true (tied) and null as an untied head; transformers refuses both
        (lambda c: c.update(tie_word_embeddings="false"), "'tie_word_embeddings' must be true"),
        (lambda c: c.update(tie_word_embeddings=None), "'tie_word_embeddings' must be true"),
        (lambda c: c.update(projector_bias=None), "'projector_bias' must be true or false"),
        (
            lambda c: c["text_config"].update(
                use_sliding_window=True, sliding_window=64, max_window_layers=1
            ),
            r"layers 1\.\.2 sliding-window attention \(max_window_layers 1 <",
        ),
    ],
)
def test_bad_configs_raise_config_error(edit: Any, message: str) -> None:
    raw = tiny.upstream_config_dict(tiny.TINY)
    edit(raw)
    with pytest.raises(ConfigError, match=message):
        MossTDConfig.from_dict(raw)


@pytest.mark.parametrize(
    "edit",
    [
        # what transformers writes for use_sliding_window on a decoder shallower than
        # max_window_layers (28): every layer full attention
        lambda t: t.update(use_sliding_window=True, sliding_window=64),
        lambda t: (t.update(use_sliding_window=True, sliding_window=64), t.pop("layer_types")),
        lambda t: (
            t.update(use_sliding_window=True, sliding_window=None, max_window_layers=0),
            t.pop("layer_types"),
        ),
    ],
)
def test_use_sliding_window_on_layers_transformers_runs_full_is_served(edit: Any) -> None:
    """use_sliding_window was refused whatever the layers: transformers runs these decoders
    with full attention in every layer (layer_types), and livemeet's tokens equal its own
    (a trial built them with transformers' save_pretrained)."""
    from transformers import MossTranscribeDiarizeConfig

    raw = tiny.hf_config(tiny.TINY).to_dict()
    edit(raw["text_config"])
    theirs = MossTranscribeDiarizeConfig.from_dict(raw).text_config
    assert theirs.layer_types == ["full_attention"] * tiny.TINY.text.layers
    assert MossTDConfig.from_dict(raw) == tiny.TINY


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: None,
        lambda t: t.pop("rope_parameters"),
        lambda t: t.update(rope_parameters=None),
        lambda t: t.update(rope_parameters=None, rope_theta=250_000.0),
        lambda t: t.pop("head_dim"),
        lambda t: (t.pop("head_dim"), t.pop("rope_parameters")),
        lambda t: t.pop("max_position_embeddings"),
        lambda t: t.update(num_key_value_heads=None),  # as many as the query heads
        lambda t: (t.pop("num_key_value_heads"), t.update(num_attention_heads=32)),
    ],
)
def test_fields_config_json_leaves_out_default_as_transformers_does(edit: Any) -> None:
    """With no RoPE theta, transformers runs Qwen3's 10,000 where we took MOSS-TD's 1e6, and
    with no head_dim its 128 where we took hidden / heads: silently other tokens than the
    oracle's (a trial). The defaults are now the oracle's, read back from its own config."""
    from transformers import MossTranscribeDiarizeConfig

    raw = tiny.hf_config(tiny.TINY).to_dict()
    edit(raw["text_config"])
    ours = MossTDConfig.from_dict(raw).text
    theirs = MossTranscribeDiarizeConfig.from_dict(raw).text_config
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.head_dim == theirs.head_dim
    assert ours.kv_heads == theirs.num_key_value_heads
    assert ours.max_position_embeddings == theirs.max_position_embeddings


@pytest.mark.parametrize("dialect", ["upstream", "hf"])
def test_loads_both_dialects_exactly(
    dialect: str, upstream_dir: Path, hf_dir: Path, tiny_weights: dict[str, torch.Tensor]
) -> None:
    model, cfg = load_model(str(upstream_dir if dialect == "upstream" else hf_dir), device="cpu")
    assert cfg == tiny.TINY and not model.training
    state = model.state_dict()
    assert set(state) == set(tiny_weights)
    assert all(torch.equal(state[n], w) for n, w in tiny_weights.items())


def _copy_hf(hf_dir: Path, tmp_path: Path, edit: Any) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(hf_dir, root)
    tensors = load_file(str(root / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(root / "model.safetensors"))
    return root


Q0 = "model.language_model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize(
    ("edit", "messages"),
    [
        (lambda t: t.pop(Q0), ["missing tensors", "language_model.layers.0.self_attn.q_proj"]),
        (lambda t: t.update({"model.extra.weight": torch.zeros(2)}), ["model.extra.weight"]),
        (
            lambda t: t.update({Q0: torch.zeros(3, 48)}),
            ["wrong shape", Q0, "(64, 48)", "(3, 48)"],
        ),
        (lambda t: t.update({Q0: t[Q0].to(torch.int32)}), ["non-float", Q0]),
        (lambda t: t.update({"lm_head.weight": torch.zeros_like(t[EMBED])}), ["untied"]),
    ],
)
def test_bad_checkpoints_raise_config_error(
    hf_dir: Path, tmp_path: Path, edit: Any, messages: list[str]
) -> None:
    root = _copy_hf(hf_dir, tmp_path, edit)
    with pytest.raises(ConfigError) as excinfo:
        load_model(str(root), device="cpu")
    for message in messages:
        assert message in str(excinfo.value)


EMBED = "model.language_model.embed_tokens.weight"


@pytest.mark.parametrize(
    ("fixture", "key"),
    [
        ("upstream_dir", "model.vq_adaptor.layers.0.weight"),
        ("hf_dir", "model.multi_modal_projector.linear_1.weight"),
    ],
)
def test_a_missing_tensor_is_named_as_the_checkpoint_names_it(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, key: str
) -> None:
    """It was named by our internal name, `adaptor.linear_1.weight`, which no checkpoint
    holds (found by a trial); the other problems were already named by their keys."""
    root = tmp_path / "ckpt"
    shutil.copytree(request.getfixturevalue(fixture), root)
    for shard in root.glob("*.safetensors"):
        tensors = load_file(str(shard))
        if key in tensors:
            del tensors[key]
            save_file(tensors, str(shard))
    with pytest.raises(ConfigError, match=rf"missing tensors: \['{re.escape(key)}'\]"):
        load_model(str(root), device="cpu")


def test_keys_of_no_known_dialect_are_named_briefly_with_the_known_prefixes(
    hf_dir: Path, tmp_path: Path
) -> None:
    """Keys under no prefix either dialect uses (here saved without the leading `model.`) were
    all listed, one sorted list with nothing about what was expected: ~32 KB on one line at
    real size (683 keys; found by a trial). Now a count, a few names and the known prefixes."""

    def edit(t: dict[str, torch.Tensor]) -> None:
        for key in list(t):
            t[key.removeprefix("model.")] = t.pop(key)

    root = _copy_hf(hf_dir, tmp_path, edit)
    with pytest.raises(ConfigError) as excinfo:
        load_model(str(root), device="cpu")
    message = excinfo.value.message
    num_keys = len(tiny.random_weights())
    assert f"{num_keys} tensors" in message and "more" in message
    assert "model.whisper_encoder." in message and "model.audio_tower." in message
    assert len(message) < 1000


def test_every_problem_is_reported_at_once(hf_dir: Path, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t.pop(Q0)
        t.pop("model.audio_tower.conv1.bias")

    root = _copy_hf(hf_dir, tmp_path, edit)
    with pytest.raises(ConfigError, match=r"conv1\.bias.*q_proj"):
        load_model(str(root), device="cpu")


def test_bf16_checkpoint_casts_and_tied_head_copy_is_accepted(
    hf_dir: Path, tmp_path: Path, tiny_weights: dict[str, torch.Tensor]
) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        for key in t:
            t[key] = t[key].to(torch.bfloat16)
        t["lm_head.weight"] = t[EMBED].clone()

    root = _copy_hf(hf_dir, tmp_path, edit)
    model, _ = load_model(str(root), device="cpu", dtype=torch.float32)
    got = model.language_model.embed_tokens.weight
    assert got.dtype == torch.float32
    assert torch.equal(got, tiny_weights["language_model.embed_tokens.weight"].bfloat16().float())


def test_a_tied_embedding_stored_as_the_head_is_the_embedding(
    hf_dir: Path, tmp_path: Path, tiny_weights: dict[str, torch.Tensor]
) -> None:
    """safetensors' save_model(model) stores tensors shared by several names once, under the
    first name in sort order: `lm_head.weight`, not the embedding. transformers loads such a
    file; ours reported the embedding missing (a trial)."""

    def edit(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t.pop(EMBED)

    root = _copy_hf(hf_dir, tmp_path, edit)
    model, _ = load_model(str(root), device="cpu")
    state = model.state_dict()
    assert all(torch.equal(state[n], w) for n, w in tiny_weights.items())


def test_wrong_model_config_is_rejected(hf_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(hf_dir, root)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ConfigError, match="model_type"):
        load_model(str(root), device="cpu")


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"metadata": {}}, "has no 'weight_map'"),  # was the bare message "'weight_map'"
        ({"weight_map": ["a.safetensors"]}, "unreadable checkpoint index"),
        ({"weight_map": {"x": 3}}, "must be file names"),
    ],
)
def test_a_malformed_index_is_named(
    upstream_dir: Path, tmp_path: Path, index: dict[str, Any], message: str
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=message):
        load_model(str(root), device="cpu")


def test_model_safetensors_is_read_alone_as_transformers_reads_it(
    upstream_dir: Path, hf_dir: Path, tmp_path: Path, tiny_weights: dict[str, torch.Tensor]
) -> None:
    """transformers reads `model.safetensors` when a directory has one, and no other weight
    file: livemeet read the shards of an index beside it instead (other weights than the
    reference's, silently) and refused a directory with any other *.safetensors file in it
    (unknown or twice-stored tensors; found by a trial)."""
    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)  # a sharded copy with its index...
    tensors = load_file(str(hf_dir / "model.safetensors"))
    tensors[Q0] = -tensors[Q0]  # ...and a model.safetensors that differs from it
    save_file(tensors, str(root / "model.safetensors"))
    q0 = "language_model.layers.0.self_attn.q_proj.weight"
    expected = {**tiny_weights, q0: -tiny_weights[q0]}
    for step in ("beside an index", "beside another weight file"):
        if step == "beside another weight file":
            (root / "model.safetensors.index.json").unlink()
            save_file({"speaker.embedding": torch.zeros(4, 4)}, str(root / "speakers.safetensors"))
        model, _ = load_model(str(root), device="cpu")
        state = model.state_dict()
        assert all(torch.equal(state[n], w) for n, w in expected.items()), step


def test_a_partial_model_safetensors_beside_an_index_is_named_in_the_error(
    upstream_dir: Path, tmp_path: Path
) -> None:
    """A stale or partial `model.safetensors` beside a complete sharded set (an interrupted
    copy, a save over another layout) is what gets read, as transformers reads it (which
    fills the missing weights at random, with a warning): the refusal listed the tensors it
    lacks as if the config were wrong, and said nothing of the shards the index lists. It
    now says which file was read, and that the index beside it was not."""
    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)  # a sharded copy with its index...
    shard = next(root.glob("*-of-*.safetensors"))
    save_file(dict(list(load_file(str(shard)).items())[:1]), str(root / "model.safetensors"))
    with pytest.raises(ConfigError, match="missing tensors") as caught:  # ...and a partial one
        load_model(str(root), device="cpu")
    assert (
        "model.safetensors is read alone, as transformers reads it: the shards "
        "model.safetensors.index.json lists beside it are not"
    ) in caught.value.message
    (root / "model.safetensors.index.json").unlink()  # alone, the file is the checkpoint
    with pytest.raises(ConfigError, match="missing tensors") as caught:
        load_model(str(root), device="cpu")
    assert "index" not in caught.value.message


def test_missing_shard_is_reported(upstream_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError, match="model-00002-of-00002"):
        load_model(str(root), device="cpu")


def cache_hub_snapshot(hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`hf_dir` as hub id someone/tiny-moss in an offline Hugging Face cache under `tmp_path`
    (its layout: models--owner--name/snapshots/<revision>, refs/main naming it); returns the
    snapshot directory."""
    from huggingface_hub import constants

    revision = "a" * 40
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny-moss" / "snapshots" / revision
    shutil.copytree(hf_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_model_path_that_is_no_directory_says_whether_it_exists(tmp_path: Path) -> None:
    """`--model /path/that/is/missing` said "is not a directory", which reads as a file
    being there (a new user's trial): a missing path and a file are told apart."""
    missing, file = tmp_path / "nomodel", tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ConfigError) as refused:
        load_model(missing, device="cpu")
    assert refused.value.message == (
        f"model path '{missing}' does not exist (nor is it a hub id, owner/name)"
    )
    with pytest.raises(ConfigError, match="is a file, not a checkpoint directory"):
        load_model(file, device="cpu")


def test_the_download_hint_quotes_its_glob() -> None:
    """`hf download ... --include config.json *.safetensors ...`, pasted into a shell, had the
    shell expand the bare glob against the files where it ran (a new user's trial)."""
    from livemeet.models.loader import download_hint

    hint = download_hint("someone/tiny-moss")
    assert hint is not None and " '*.safetensors' " in hint and " *.safetensors " not in hint


def test_hub_id_resolves_through_the_local_cache(
    hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_hub_snapshot(hf_dir, tmp_path, monkeypatch)
    model, cfg = load_model("someone/tiny-moss", device="cpu")
    assert cfg == tiny.TINY
    with pytest.raises(ConfigError, match=r"hf download someone/other-model .*config\.json"):
        load_model("someone/other-model", device="cpu")
    with pytest.raises(ConfigError, match=r"tokenizer\.json tokenizer_config\.json processor"):
        load_model("someone/other-model", device="cpu")


def test_a_hub_id_engine_reads_the_snapshots_tokenizer_and_prompt_settings(
    hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id went only to the weights: the engine took the built-in tokenizer and the
    default prompt settings instead of the checkpoint's own, where a local directory had
    to hold them (found by an independent trial). Now both come from the cached snapshot."""
    from livemeet.engine.engine import Engine, EngineConfig
    from livemeet.models.tokenizer import load_tokenizer

    snapshot = cache_hub_snapshot(hf_dir, tmp_path, monkeypatch)
    config = EngineConfig(model="someone/tiny-moss", device="cpu", num_kv_blocks=64)
    with pytest.raises(ConfigError, match="no tokenizer.json") as refused:
        Engine(config)  # as for a local directory without it, with the command that fixes it
    assert "hf download someone/tiny-moss --include" in refused.value.message
    # what it needs, as the README says: not tokenizer_config.json, and processor_config.json
    # is optional (the message asked for both: a trial)
    assert "(with tokenizer_config.json" not in refused.value.message
    assert "processor_config.json is optional" in refused.value.message
    load_tokenizer(None).save(str(snapshot / "tokenizer.json"))
    shipped = {"audio_tokens_per_second": 12.5, "audio_merge_size": 4,
               "time_marker_every_seconds": 2, "enable_time_marker": True}  # fmt: skip
    (snapshot / "processor_config.json").write_text(json.dumps(shipped))
    import huggingface_hub

    lookups: list[str] = []
    real_lookup = huggingface_hub.snapshot_download

    def counted(repo_id: str, **kwargs: Any) -> str:
        lookups.append(repo_id)
        return str(real_lookup(repo_id, **kwargs))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", counted)
    engine = Engine(config)
    assert engine.prompt_config.time_marker_every_s == 2
    assert lookups == ["someone/tiny-moss"]  # once: weights, tokenizer and settings share it


def test_check_config_on_a_hub_snapshot_names_what_to_cache(
    hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--check-config gave a start's error without its `hf download` hint (a review)."""
    from livemeet.cli.serve import preflight_model
    from livemeet.config import ModelConfig

    cache_hub_snapshot(hf_dir, tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match="hf download someone/tiny-moss --include"):
        preflight_model(ModelConfig(model="someone/tiny-moss", device="cpu"))


def test_unknown_path_and_missing_model_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(str(tmp_path / "no" / "such" / "dir"), device="cpu")
    with pytest.raises(ConfigError, match="no model given"):
        load_model(None, device="cpu")
    with pytest.raises(ConfigError, match="load_format"):
        load_model(str(tmp_path), load_format="gguf", device="cpu")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path), device="cpu")


def test_dummy_weights_keep_activations_sane(upstream_dir: Path) -> None:
    model, cfg = load_model(str(upstream_dir), load_format="dummy", device="cpu")
    from livemeet.layers.attention import DenseAttention

    with torch.no_grad():
        audio = model.encode_audio(torch.randn(1, 80, 3000), [375])
        embeds = model.embed_prompt(torch.full((375,), cfg.audio_token_id), audio)
        hidden = model(embeds, torch.arange(375), DenseAttention([model.new_kv_cache()], [375]))
        logits = model.compute_logits(hidden[-1:])
    assert torch.isfinite(logits).all()
    assert 0.1 < float(hidden.std()) < 10.0


def test_devices_this_machine_lacks_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--device cuda` on a CPU-only torch build failed with an AssertionError reported as
    internal_error (found by an independent trial); now a config error naming the fix."""
    from livemeet.models import loader

    assert loader.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        loader.resolve_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        loader.resolve_device("cuda")
    assert loader.resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert loader.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="only 1 CUDA device"):
        loader.resolve_device("cuda:3")


def test_a_checkpoint_directory_this_user_may_not_read_is_named(
    upstream_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint copied as root (mode 0700) and served by a service user: `serve` and its
    `--check-config` ended in a traceback (PermissionError from the stat of config.json) and
    exit 1 (the container trial)."""
    from livemeet.models.loader import check_checkpoint

    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)
    deny_access(monkeypatch, root)
    for load in (check_checkpoint, lambda path: load_model(path, device="cpu")):
        with pytest.raises(ConfigError, match="cannot read checkpoint directory") as refused:
            load(str(root))
        assert f"{root}: Permission denied" in refused.value.message


def test_a_dangling_symlink_in_a_checkpoint_directory_is_no_refusal(
    upstream_dir: Path, tmp_path: Path
) -> None:
    """The check that a checkpoint directory may be entered stats one of its entries: a
    dangling symlink listed first (a hub-cache snapshot whose blob was pruned) made a readable
    directory "cannot read checkpoint directory ...: No such file or directory"."""
    from livemeet.models import loader

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "a-pruned-blob").symlink_to(tmp_path / "gone")  # the only entry: the one stat'ed
    assert loader.resolve_checkpoint(root) == root
    shutil.rmtree(root)
    shutil.copytree(upstream_dir, root)
    (root / "a-pruned-blob").symlink_to(tmp_path / "gone")
    assert loader.check_checkpoint(root) == loader.read_checkpoint_config(upstream_dir)


def test_a_shard_this_user_may_not_read_is_not_called_missing(
    upstream_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors says "No such file or directory" for a file it may not open (a shard
    copied as root, mode 0600): the operator saw it listed by `ls` (the container trial)."""
    from livemeet.models.loader import check_checkpoint

    root = tmp_path / "ckpt"
    shutil.copytree(upstream_dir, root)
    shard = root / "model-00002-of-00002.safetensors"
    deny_access(monkeypatch, shard)
    with pytest.raises(ConfigError, match="cannot read safetensors file") as refused:
        check_checkpoint(str(root))
    assert refused.value.message.endswith(f"{shard}: Permission denied")


def test_no_writable_directory_for_torchs_cache_is_a_config_error(
    upstream_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch makes its cache directory (torchinductor_<user> in the temporary directory)
    when it first builds a model: with /tmp read-only and TMPDIR unset, a start failed with
    "backend failed to load: FileNotFoundError(... No usable temporary directory ...)", a
    traceback and exit 1 (the container trial). It is the operator's to provide: said so."""
    import tempfile

    from livemeet.models.loader import check_checkpoint

    def no_usable_temporary_directory() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "gettempdir", no_usable_temporary_directory)
    loads = (
        check_checkpoint,
        lambda path: load_model(path, device="cpu"),
        lambda path: load_model(path, load_format="dummy", device="cpu"),
    )
    for load in loads:
        with pytest.raises(ConfigError, match="torch cannot make its cache directory") as refused:
            load(str(upstream_dir))
        assert "No usable temporary directory" in refused.value.message
        assert "point TMPDIR (or TORCHINDUCTOR_CACHE_DIR) at one" in refused.value.message
