"""The serving engine: schedule -> encode -> run -> sample -> postprocess, one step at a time.

`Engine.add_request` turns audio into a prompt (livemeet.models.prompt) and audio embeddings
(EncoderRunner), and queues a `Request`; `Engine.step()` runs one scheduled batch on the
ModelRunner and returns the new tokens and finished requests. The engine is single-threaded:
the worker process (livemeet/engine/worker.py) owns it. Policy lives in the Scheduler and
BlockManager (plain Python); the device lives in the ModelRunner and EncoderRunner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from livemeet.audio.constants import KV_BLOCK_SIZE, SAMPLE_RATE
from livemeet.engine.block_manager import BlockManager
from livemeet.engine.encoder_runner import EncoderRunner
from livemeet.engine.model_runner import ModelRunner
from livemeet.engine.request import Request, RequestClass
from livemeet.engine.sampler import SamplingParams
from livemeet.engine.scheduler import Scheduler, SchedulerConfig, StepOutput
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.loader import load_model
from livemeet.models.prompt import EOS, PromptConfig, PromptIds, build_prompt
from livemeet.models.tokenizer import load_tokenizer

MIN_OUTPUT_BUDGET = 512  # tokens; floor of the duration-scaled budget (SGLang-Omni default)
OUTPUT_TOKENS_PER_AUDIO_S = 10  # tokens per audio second; dense meetings use ~4.5-6 (MODEL 5.5)


def output_budget(duration_s: float, num_prompt_tokens: int, max_model_len: int) -> int:
    """Duration-scaled max_new_tokens: max(512, ceil(10 x duration)), clamped to the context.

    Source: SGLang-Omni's MOSS-TD budget (MODEL.md section 5.5). Returns >= 1.
    """
    wanted = max(MIN_OUTPUT_BUDGET, math.ceil(OUTPUT_TOKENS_PER_AUDIO_S * duration_s))
    return max(1, min(wanted, max_model_len - num_prompt_tokens - 1))


@dataclass(frozen=True)
class EngineConfig:
    """How the engine is built. `model`: checkpoint dir / hub id, or None with `load_format`
    "dummy" (real-size random weights). `num_kv_blocks`: fixed pool size (tests), else sized
    from free memory x `mem_fraction`. `kv_cache_dtype`: "auto" (model dtype) or "fp8_e4m3"."""

    model: str | None = None
    load_format: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = KV_BLOCK_SIZE
    num_kv_blocks: int | None = None
    mem_fraction: float = 0.85
    kv_cache_dtype: str = "auto"
    encoder_cache_windows: int = 256
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


class Engine:
    """See module docstring. `clock` returns seconds (monotonic) for the scheduler."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: tuple[MossTDModel, MossTDConfig] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.model, self.model_config = model or load_model(
            config.model,
            load_format=config.load_format,
            device=config.device,
            dtype=config.dtype,
        )
        root = Path(config.model) if config.model and Path(config.model).is_dir() else None
        self.tokenizer = load_tokenizer(root)
        self.prompt_config = PromptConfig.from_checkpoint(root) if root else PromptConfig()
        kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype == "fp8_e4m3" else None
        self.runner = ModelRunner(
            self.model,
            self.model_config,
            block_size=config.block_size,
            num_kv_blocks=config.num_kv_blocks,
            mem_fraction=config.mem_fraction,
            kv_dtype=kv_dtype,
        )
        self.encoder = EncoderRunner(self.model, cache_windows=config.encoder_cache_windows)
        self.block_manager = BlockManager(self.runner.num_kv_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.scheduler)
        self.clock = clock
        self._audio: dict[str, torch.Tensor] = {}
        self._sampling: dict[str, SamplingParams] = {}
        self._forced: dict[str, Sequence[int]] = {}

    def build_prompt(
        self, num_audio_tokens: int, prompt: str | None = None, hotwords: Sequence[str] = ()
    ) -> PromptIds:
        return build_prompt(
            self.tokenizer,
            num_audio_tokens,
            prompt=prompt,
            hotwords=hotwords,
            config=self.prompt_config,
        )

    def add_request(
        self,
        request_id: str,
        samples: np.ndarray,
        *,
        prompt: str | None = None,
        hotwords: Sequence[str] = (),
        request_class: RequestClass = RequestClass.UPLOAD,
        max_new_tokens: int | None = None,
        deadline_s: float | None = None,
        sampling: SamplingParams | None = None,
        forced_output_ids: Sequence[int] | None = None,
        prefix_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        retain_kv: bool = False,
        fork_from: str | None = None,
        num_fork_tokens: int = 0,
    ) -> Request:
        """Encode `samples` (16 kHz mono float32 [n]) and queue a request for them.

        `prefix_token_ids` are forced assistant tokens appended after the prompt (DESIGN 5.3).
        `forced_output_ids` (benchmarks): after sampling, the i-th output token is replaced by
        forced_output_ids[i], then EOS once they run out. `ignore_eos` decodes to
        max_new_tokens (tests, benchmarks). `retain_kv`, `fork_from`, `num_fork_tokens`: passed
        to `Scheduler.add` (keep this request's KV after it finishes; share the first tokens' KV
        of another request); the caller vouches that the audio embeddings at the forked
        positions are unchanged; `request.num_cached_tokens` then counts the reused tokens.
        Raises BadAudio (empty or non-finite audio), InvalidRequest (bad prompt), TooLong (no
        room in the context).
        """
        embeds = self.encoder.encode([samples])[0]
        built = self.build_prompt(embeds.shape[0], prompt, hotwords)
        ids = built.ids + list(prefix_token_ids)
        duration_s = len(samples) / SAMPLE_RATE
        budget = max_new_tokens or output_budget(
            duration_s, len(ids), self.scheduler.config.max_model_len
        )
        request = Request(
            request_id,
            ids,
            request_class=request_class,
            max_new_tokens=budget,
            deadline_s=deadline_s,
            arrival_s=self.clock(),
            audio_positions=tuple(built.audio_positions),
            ignore_eos=ignore_eos,
        )
        self.scheduler.add(
            request, retain_kv=retain_kv, fork_from=fork_from, num_fork_tokens=num_fork_tokens
        )
        self._audio[request_id] = embeds
        self._sampling[request_id] = sampling or SamplingParams()
        if forced_output_ids is not None:
            self._forced[request_id] = forced_output_ids
        return request

    def abort(self, request_id: str) -> None:
        """Stop a request at any phase; frees its KV exactly once. Unknown ids are ignored."""
        self.scheduler.abort(request_id)
        self._forget(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepOutput:
        """Run one scheduled batch. Returns the new tokens and the requests that finished."""
        batch = self.scheduler.schedule(self.clock())
        if batch.is_empty:
            return StepOutput((), ())
        sampled = self.runner.run(batch, self._audio, self._sampling_of)
        sampled = self._apply_forced(batch.sampled_requests, sampled)
        out = self.scheduler.postprocess(batch, sampled)
        for request in out.finished:
            self._forget(request.request_id)
        return out

    def run_to_completion(self) -> dict[str, Request]:
        """Step until idle (offline jobs and tests); returns the finished requests by id."""
        done: dict[str, Request] = {}
        while self.has_work():
            for request in self.step().finished:
                done[request.request_id] = request
        return done

    def _sampling_of(self, request: Request) -> SamplingParams:
        return self._sampling.get(request.request_id, SamplingParams())

    def _apply_forced(self, requests: Sequence[Request], sampled: list[int]) -> list[int]:
        if not self._forced:
            return sampled
        out = list(sampled)
        for i, request in enumerate(requests):
            forced = self._forced.get(request.request_id)
            if forced is None:
                continue
            k = request.num_output_tokens
            out[i] = forced[k] if k < len(forced) else EOS
        return out

    def _forget(self, request_id: str) -> None:
        self._audio.pop(request_id, None)
        self._sampling.pop(request_id, None)
        self._forced.pop(request_id, None)
