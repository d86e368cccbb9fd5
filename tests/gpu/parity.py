"""Teacher-forced parity of livemeet's serving path against the transformers 5.24 reference.

The proof the serving-engine issue asks for (DESIGN.md section 8): on the same weights, the
same prompt ids and the same audio, with encoder windows run one at a time on both sides (GPU
kernels may pick other algorithms for other batch shapes, MODEL.md section 2), compare

- teacher-forced logits: the prompt followed by a forced transcript of F tokens; for each of
  the F positions that predict a forced token, our logits vs the reference's. Reported: max
  |delta| over every position and vocab entry, and top-1 agreement over the positions where
  the reference's top-1 minus top-2 logit exceeds `margin` (0.05: the issue's threshold);
- greedy decoding for a few steps: ours vs `generate`, and the first index where they differ.

Our logits come from two paths over the paged KV kernels:
- "direct": MossTDModel forward with PagedAttentionBackend on a KV pool: the prompt prefilled
  in chunks (extend kernel), then the forced tokens one at a time (split-K decode kernel);
- "engine": the real Engine (scheduler, chunked prefill, forced output ids, whatever decode
  features the EngineConfig turns on, e.g. CUDA graphs). Its logits are read by wrapping
  `compute_logits` on the model instance for the run (no hook in the engine); if the engine
  stops calling it once per sampled row, this path reports the mismatch instead of numbers.

The reference model is built from our config (hf_config) and receives the same tensors
through `load_state_dict` with the HF-native key names (MODEL.md 8.1), no files written; a
checkpoint directory can be loaded the same way (`reference_from_checkpoint`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from livemeet.audio.constants import KV_BLOCK_SIZE, SAMPLES_PER_TOKEN, WINDOW_SAMPLES
from livemeet.engine.encoder_runner import EncoderRunner
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import ModelRunner
from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata
from livemeet.engine.scheduler import SchedulerConfig
from livemeet.layers.paged_attention import choose_num_splits
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.dialects import canonical_name
from livemeet.models.prompt import ENDOFTEXT, EOS
from tests.models.tiny import checkpoint_key, hf_config

MARGIN = 0.05  # logits; the confidence threshold for top-1 agreement
FORCED_TOKENS = 64
GREEDY_STEPS = 32
# EngineConfig fields that turn on the fast decode path, applied when the config has them.
FAST_DECODE_OPTIONS: Mapping[str, Any] = {"cuda_graphs": True, "async_decode": True}
# Tied to embed_tokens in the reference, so absent from a MOSS-TD state dict (MODEL.md 4).
TIED_KEYS = frozenset({"lm_head.weight"})


class ParityError(RuntimeError):
    """The comparison could not be set up (weights did not transfer, prompts differ...)."""


@dataclass(frozen=True)
class ParitySetup:
    """How to compare. `chunk_size`: prefill chunk (tokens); `engine_options`: extra
    EngineConfig fields (only those the config defines are used; see `engine_config`)."""

    chunk_size: int = 512
    forced_tokens: int = FORCED_TOKENS
    greedy_steps: int = GREEDY_STEPS
    margin: float = MARGIN
    engine_options: Mapping[str, Any] = field(default_factory=lambda: dict(FAST_DECODE_OPTIONS))


@dataclass(frozen=True)
class LogitParity:
    """One path's teacher-forced comparison over `num_positions` positions ([F, vocab])."""

    path: str
    max_abs_delta: float
    top1_agreement: float  # over positions with reference margin > setup.margin; nan if none
    num_positions: int
    num_confident: int
    reference_scale: float = math.nan  # max |reference logit|, to read max_abs_delta against
    error: str | None = None  # why this path produced no numbers


@dataclass(frozen=True)
class ClipParity:
    """Everything measured on one clip."""

    seconds: float
    windows: int
    prompt_tokens: int
    prompt_ids_match_reference: bool
    logits: tuple[LogitParity, ...]
    greedy_ours: tuple[int, ...]
    greedy_reference: tuple[int, ...]
    greedy_first_divergence: int | None  # None: identical


@dataclass(frozen=True)
class ParityReport:
    device: str
    dtype: str
    chunk_size: int
    engine_options_applied: dict[str, Any]
    clips: tuple[ClipParity, ...]

    def to_json(self) -> str:
        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [clean(v) for v in value]
            return value

        return json.dumps(clean(asdict(self)), indent=2)

    def summary(self) -> str:
        """One line per clip and path: max |delta|, top-1 agreement, greedy divergence."""
        lines = [
            f"parity {self.device} {self.dtype} chunk={self.chunk_size} "
            f"engine_options={self.engine_options_applied}"
        ]
        for c in self.clips:
            div = (
                "identical"
                if c.greedy_first_divergence is None
                else (f"first divergence at {c.greedy_first_divergence}")
            )
            for p in c.logits:
                body = p.error or (
                    f"max|delta|={p.max_abs_delta:.4g} (max|logit| {p.reference_scale:.4g}) "
                    f"top1={p.top1_agreement:.4f} "
                    f"({p.num_confident}/{p.num_positions} confident)"
                )
                lines.append(f"  {c.seconds:6.1f}s prompt={c.prompt_tokens} {p.path:6s} {body}")
            lines.append(f"  {c.seconds:6.1f}s greedy {len(c.greedy_ours)} steps: {div}")
        return "\n".join(lines)


# ---------------------------------------------------------------- the reference model


def reference_from_state(
    state: Mapping[str, torch.Tensor], cfg: MossTDConfig, device: str, dtype: torch.dtype
) -> Any:
    """The transformers reference built from `cfg`, loaded with `state` (OUR canonical names).

    Built through `_from_config(dtype=...)` as `from_pretrained` would, so the RoPE inverse
    frequencies stay float32 (a plain `.to(bf16)` would round them). Raises ParityError when a
    tensor is missing or unexpected, or the head is not tied to the embeddings.
    """
    from transformers import MossTranscribeDiarizeForConditionalGeneration as Reference

    with torch.device(device):
        ref = Reference._from_config(hf_config(cfg), dtype=dtype)
    renamed = {checkpoint_key(name, "hf"): t for name, t in state.items()}
    result = ref.load_state_dict(renamed, strict=False)
    missing = set(result.missing_keys) - TIED_KEYS
    if missing or result.unexpected_keys:
        raise ParityError(
            f"reference load: missing {sorted(missing)}, unexpected {result.unexpected_keys}"
        )
    embed = ref.get_input_embeddings().weight
    if not torch.equal(ref.lm_head.weight, embed):
        raise ParityError("reference lm_head is not tied to embed_tokens after loading")
    return ref.eval()


def reference_from_ours(model: MossTDModel, device: str, dtype: torch.dtype) -> Any:
    """The reference with exactly our model's tensors (copied, no files)."""
    return reference_from_state(model.state_dict(), model.cfg, device, dtype)


def reference_from_checkpoint(
    root: Path, cfg: MossTDConfig, device: str, dtype: torch.dtype
) -> Any:
    """The reference loaded from a checkpoint directory of either dialect (keys renamed)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(root.glob("*.safetensors")):
        for key, tensor in load_file(str(file)).items():
            name = canonical_name(key)
            if name is None:
                if key in TIED_KEYS:
                    continue
                raise ParityError(f"{file.name}: unknown tensor {key}")
            state[name] = tensor
    return reference_from_state(state, cfg, device, dtype)


@torch.inference_mode()
def _reference_prompt(ref: Any, clip: np.ndarray) -> tuple[list[int], torch.Tensor]:
    """The reference processor's prompt ids and its prompt embeddings [L, hidden] with the
    audio spliced in, each 30 s window encoded alone."""
    from tests.models.reference import make_reference_processor

    inputs = make_reference_processor().apply_transcription_request(clip, return_tensors="pt")
    weight = ref.get_input_embeddings().weight
    feats = inputs["input_features"].to(weight.device, weight.dtype)
    mask = inputs["input_features_mask"].to(weight.device)
    audio = torch.cat(
        [
            ref.model.get_audio_features(feats[w : w + 1], mask[w : w + 1], None).pooler_output
            for w in range(feats.shape[0])
        ]
    )
    ids = inputs["input_ids"][0].to(weight.device)
    embeds = ref.get_input_embeddings()(ids)
    embeds[ids == ref.config.audio_token_id] = audio.to(embeds.dtype)
    return ids.tolist(), embeds


@torch.inference_mode()
def _reference_logits(ref: Any, prompt_embeds: torch.Tensor, forced: Sequence[int]) -> torch.Tensor:
    """Reference logits [F, vocab] (float32, CPU) at the positions predicting forced[i]."""
    dev = prompt_embeds.device
    tail = ref.get_input_embeddings()(torch.tensor(list(forced[:-1]), device=dev))
    embeds = torch.cat([prompt_embeds, tail])[None]
    out = ref(inputs_embeds=embeds, logits_to_keep=len(forced))
    return out.logits[0].float().cpu()


@torch.inference_mode()
def _reference_greedy(ref: Any, prompt_embeds: torch.Tensor, steps: int) -> list[int]:
    embeds = prompt_embeds[None]
    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    out = ref.generate(
        inputs_embeds=embeds,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=steps,
        min_new_tokens=steps,
        eos_token_id=EOS,
        pad_token_id=ENDOFTEXT,
    )
    return out[0, -steps:].tolist()


# ---------------------------------------------------------------- our two paths


def _step_meta(
    table: torch.Tensor, start: int, end: int, decode: bool, kv_heads: int
) -> StepMetadata:
    """Metadata for one sequence whose block table is 0..n-1 (slot = position)."""
    dev = table.device
    splits = choose_num_splits(1, end, kv_heads) if decode and dev.type == "cuda" else None
    return StepMetadata(
        slot_mapping=torch.arange(start, end, dtype=torch.long, device=dev),
        block_tables=table,
        seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
        cu_seqlens_q=torch.tensor([0, end - start], dtype=torch.int32, device=dev),
        max_seqlen_q=end - start,
        max_seq_len=end,
        decode_only=decode,
        num_splits=splits,
    )


@torch.inference_mode()
def ours_direct_logits(
    model: MossTDModel,
    prompt_ids: Sequence[int],
    audio: torch.Tensor,
    forced: Sequence[int],
    chunk_size: int,
) -> torch.Tensor:
    """Our logits [F, vocab] (float32, CPU): prompt prefilled in `chunk_size` chunks with the
    extend kernel, then forced[:-1] fed one token at a time through the decode kernel."""
    cfg = model.cfg
    total = len(prompt_ids) + len(forced)
    blocks = math.ceil(total / KV_BLOCK_SIZE)
    runner = ModelRunner(model, cfg, block_size=KV_BLOCK_SIZE, num_kv_blocks=blocks)
    dev = runner.device
    table = torch.arange(blocks, dtype=torch.int32, device=dev)[None]
    ids = torch.tensor([*prompt_ids, *forced[:-1]], dtype=torch.long, device=dev)
    embeds = model.embed_prompt(ids, audio.to(dev))
    num_prompt = len(prompt_ids)
    rows = []
    steps = [(s, min(num_prompt, s + chunk_size), False) for s in range(0, num_prompt, chunk_size)]
    steps += [(p, p + 1, True) for p in range(num_prompt, len(ids))]
    for start, end, decode in steps:
        meta = _step_meta(table, start, end, decode, cfg.text.kv_heads)
        attn = PagedAttentionBackend(runner.k_caches, runner.v_caches, meta)
        positions = torch.arange(start, end, device=dev)
        hidden = model(embeds[start:end], positions, attn)
        if end >= num_prompt:
            rows.append(model.compute_logits(hidden[-1:]).float().cpu())
    return torch.cat(rows)


class _LogitsRecorder:
    """Records every `model.compute_logits` output while installed (instance attribute that
    shadows the method; removed on exit)."""

    def __init__(self, model: MossTDModel) -> None:
        self.model = model
        self.calls: list[torch.Tensor] = []

    def __enter__(self) -> _LogitsRecorder:
        original = type(self.model).compute_logits

        def record(hidden: torch.Tensor) -> torch.Tensor:
            logits = original(self.model, hidden)
            self.calls.append(logits.detach().clone())
            return logits

        self.model.compute_logits = record  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.model.compute_logits


def engine_config(
    checkpoint: Path | None, num_kv_blocks: int, setup: ParitySetup
) -> tuple[EngineConfig, dict[str, Any]]:
    """EngineConfig for parity runs and the subset of `setup.engine_options` it accepted
    (fields a given engine version does not define are left out and so not reported)."""
    known = set(EngineConfig.__dataclass_fields__)
    applied = {k: v for k, v in setup.engine_options.items() if k in known}
    sched = SchedulerConfig(
        chunked_prefill_size=setup.chunk_size,
        max_num_batched_tokens=max(setup.chunk_size, 8_192),
    )
    config = EngineConfig(
        model=str(checkpoint) if checkpoint else None,
        num_kv_blocks=num_kv_blocks,
        scheduler=sched,
        **applied,
    )
    return config, applied


def ours_engine_logits(
    engine: Engine, clip: np.ndarray, forced: Sequence[int], request_id: str
) -> tuple[torch.Tensor | None, str | None]:
    """Teacher-forced logits [F, vocab] through the Engine (forced output ids), or None and
    the reason when the recorded calls do not map one-to-one onto the forced positions."""
    request = engine.add_request(
        request_id,
        clip,
        forced_output_ids=list(forced),
        max_new_tokens=len(forced),
        ignore_eos=True,
    )
    with _LogitsRecorder(engine.model) as recorder:
        engine.run_to_completion()
    if request.output_token_ids != list(forced):
        return None, f"engine emitted {request.output_token_ids[:8]}... not the forced ids"
    if len(recorder.calls) != len(forced) or any(c.shape[0] != 1 for c in recorder.calls):
        shapes = [tuple(c.shape) for c in recorder.calls[:4]]
        return None, (
            f"recorded {len(recorder.calls)} compute_logits calls (first shapes {shapes}) for "
            f"{len(forced)} forced positions: the engine's logits call pattern changed"
        )
    return torch.cat(recorder.calls).float().cpu(), None


def compare_logits(path: str, ours: torch.Tensor, ref: torch.Tensor, margin: float) -> LogitParity:
    """Max |delta| and top-1 agreement where the reference's top-1 - top-2 > margin."""
    top2 = ref.topk(2, dim=-1).values
    confident = (top2[:, 0] - top2[:, 1]) > margin
    agree = ours.argmax(-1) == ref.argmax(-1)
    n = int(confident.sum())
    rate = float(agree[confident].float().mean()) if n else float("nan")
    delta = float((ours - ref).abs().max())
    return LogitParity(path, delta, rate, ref.shape[0], n, float(ref.abs().max()))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def reference_texts(data_dir: Path) -> list[str]:
    """The English reference transcripts of the shared data (jfk, LibriSpeech, LibriVox), in
    that order, with utterance ids and <s> marks removed."""
    texts = []
    for name in ("jfk/text", "librispeech-lhotse/text"):
        for line in (data_dir / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                texts.append(line.split(maxsplit=1)[1])
    sphinx = (data_dir / "librivox-pocketsphinx" / "transcription").read_text(encoding="utf-8")
    for line in sphinx.splitlines():
        words = [w for w in line.split() if w not in ("<s>", "</s>") and not w.startswith("(")]
        if words:
            texts.append(" ".join(words))
    return texts


def forced_transcript(tokenizer: Any, texts: Sequence[str], num_tokens: int) -> list[int]:
    """A MOSS-TD-grammar transcript (MODEL.md 6) of `texts`, one 5 s segment each, alternating
    two speakers, cut to `num_tokens` ids. Raises ParityError when the texts are too short."""
    parts = []
    for i, text in enumerate(texts):
        parts.append(f"[{5.0 * i:.2f}][S{1 + i % 2:02d}] {text.strip()}[{5.0 * i + 4.8:.2f}]")
    ids = tokenizer.encode("".join(parts)).ids
    if len(ids) < num_tokens:
        raise ParityError(f"forced transcript has {len(ids)} tokens, {num_tokens} wanted")
    return ids[:num_tokens]


# ---------------------------------------------------------------- the whole comparison


def run_parity(
    model: MossTDModel,
    ref: Any,
    clips: Mapping[float, np.ndarray],
    forced: Sequence[int],
    setup: ParitySetup,
    checkpoint: Path | None = None,
) -> ParityReport:
    """Compare `model` (ours) and `ref` on each clip (seconds -> 16 kHz mono float32).

    `forced`: the teacher-forced transcript ids (len = setup.forced_tokens). Does not assert:
    the caller judges the report (tests assert, the validation script prints).
    """
    weight = model.language_model.embed_tokens.weight
    longest = max(len(c) for c in clips.values())
    # Room for two live requests of the longest clip: audio tokens + 10% markers + text.
    per_request = math.ceil(longest / SAMPLES_PER_TOKEN) * 11 // 10 + 400 + setup.forced_tokens
    pool_tokens = 2 * per_request
    config, applied = engine_config(checkpoint, math.ceil(pool_tokens / KV_BLOCK_SIZE), setup)
    engine = Engine(config, model=(model, model.cfg))
    engine.encoder.max_windows_per_batch = 1  # windows one at a time, as on the reference side
    warm = next(iter(clips.values()))[:16_000]
    engine.add_request("warmup", warm, max_new_tokens=4, ignore_eos=True)
    engine.run_to_completion()  # lets lazily captured decode graphs exist before recording
    encoder = EncoderRunner(model, cache_windows=0, max_windows_per_batch=1)
    results = []
    with torch.inference_mode():
        for seconds, clip in clips.items():
            results.append(_clip_parity(engine, encoder, ref, seconds, clip, forced, setup))
    return ParityReport(
        str(weight.device),
        str(weight.dtype).removeprefix("torch."),
        setup.chunk_size,
        applied,
        tuple(results),
    )


def _clip_parity(
    engine: Engine,
    encoder: EncoderRunner,
    ref: Any,
    seconds: float,
    clip: np.ndarray,
    forced: Sequence[int],
    setup: ParitySetup,
) -> ClipParity:
    model = engine.model
    audio = encoder.encode([clip])[0]
    prompt = engine.build_prompt(audio.shape[0]).ids
    ref_ids, ref_embeds = _reference_prompt(ref, clip)
    ref_logits = _reference_logits(ref, ref_embeds, forced)
    paths = [
        compare_logits(
            "direct",
            ours_direct_logits(model, prompt, audio, forced, setup.chunk_size),
            ref_logits,
            setup.margin,
        )
    ]
    engine_logits, problem = ours_engine_logits(engine, clip, forced, f"tf-{seconds}")
    if engine_logits is None:
        paths.append(LogitParity("engine", math.nan, math.nan, len(forced), 0, error=problem))
    else:
        paths.append(compare_logits("engine", engine_logits, ref_logits, setup.margin))
    request = engine.add_request(
        f"greedy-{seconds}", clip, max_new_tokens=setup.greedy_steps, ignore_eos=True
    )
    engine.run_to_completion()
    ours = list(request.output_token_ids)
    theirs = _reference_greedy(ref, ref_embeds, setup.greedy_steps)
    return ClipParity(
        seconds=seconds,
        windows=math.ceil(len(clip) / WINDOW_SAMPLES),
        prompt_tokens=len(prompt),
        prompt_ids_match_reference=prompt == ref_ids,
        logits=tuple(paths),
        greedy_ours=tuple(ours),
        greedy_reference=tuple(theirs),
        greedy_first_divergence=first_divergence(ours, theirs),
    )
