"""One decoder request as the scheduler and block manager see it (no torch, no I/O).

A request is a prompt of token ids (audio positions hold the `<|audio_pad|>` placeholder whose
embedding the model runner splices in, MODEL.md section 2) plus the tokens sampled so far.
Every token of `all_token_ids` needs KV; `num_computed_tokens` of them have it. A step computes
tokens [num_computed_tokens, num_computed_tokens + n); when that reaches `num_tokens`, the last
logit is sampled and the new token appended. After a preemption the KV is gone and the whole
sequence (prompt and outputs) is recomputed by chunked prefill.

Draft verification (speculative decoding with a given draft): the last `num_draft_tokens`
prompt ids may be a guess of the first outputs (a live hop's: what the previous hop decoded
after the same forced transcript). The final prefill chunk then samples greedily at the row
before the draft and at every draft row (k + 1 rows for k draft ids); the longest prefix of
the draft that equals those samples is accepted, followed by the sample after it
(`Scheduler.accept_draft`). The outputs are exactly what greedy decoding would produce, in
one step instead of j + 1 (j accepted); the rejected draft ids leave the prompt and their KV
is truncated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from livemeet.errors import InvalidRequest
from livemeet.transcript.segments import FinishReason

# Placeholder for a sampled token still on the device (async decode: `Scheduler.postprocess`
# with `pending`, until the engine's resolve); never a vocabulary id.
PENDING_TOKEN_ID = -1


class Status(Enum):
    """Where a request is in its life."""

    WAITING = "waiting"  # added, not admitted yet (may hold forked prefix blocks)
    RUNNING = "running"  # admitted: holds blocks for every token it must compute
    PREEMPTED = "preempted"  # evicted under memory pressure; waits to be recomputed
    FINISHED = "finished"  # done or aborted; `finish_reason` says which


class RequestClass(Enum):
    """Scheduling class: live hops outrank uploads (DESIGN.md section 4)."""

    LIVE = "live"
    UPLOAD = "upload"


@dataclass(eq=False)
class Request:
    """A prompt to prefill and a completion to decode.

    `prompt_token_ids`: [num_prompt_tokens] token ids. `audio_positions`: strictly increasing
    positions in the prompt whose embeddings are audio (spliced in by the model runner); any
    int sequence, kept as a read-only int64 array [num_audio_tokens] (an int64 array is kept
    as it is, so a PromptBuilder's view of its template costs no copy). `deadline_s`: absolute
    time on the scheduler's clock by which a live hop should finish (None: no deadline).
    `arrival_s`: time on the same clock when it was submitted (orders uploads).
    `num_encoded_audio`: the audio embeddings from the request's next audio position up to
    n are encoded (set by the Engine, which encodes an upload's 30-s windows as its prefill
    chunks reach them; the Scheduler charges an upload's chunk for the windows past n). Those
    before a fork's first chunk may never be: its chunks start past them.
    `cached_audio_windows`: 30-s windows (indexes into the audio) past `num_encoded_audio`
    that its next chunk may reach and whose embeddings the encoder's cache holds, so that
    encoding them costs nothing (set by the Engine right before a schedule that charges
    encodes; the Scheduler charges a chunk only for the other windows).
    `block_table`: KV block ids, owned and mutated by the BlockManager only; block i holds the
    KV of tokens [i * block_size, (i + 1) * block_size).

    Raises InvalidRequest for an empty prompt, a non-positive `max_new_tokens`, or audio
    positions that are unsorted, duplicated or outside the prompt.
    """

    request_id: str
    prompt_token_ids: list[int]
    request_class: RequestClass = RequestClass.UPLOAD
    max_new_tokens: int = 5120
    deadline_s: float | None = None
    arrival_s: float = 0.0
    audio_positions: np.ndarray | Sequence[int] = ()
    ignore_eos: bool = False  # benchmarks (--forced-output) decode to max_new_tokens
    num_draft_tokens: int = 0  # the prompt's last ids are a draft of the outputs (module doc)
    num_accepted_draft_tokens: int = 0  # of them, accepted (set once verified)
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # of those, tokens reused from another request (fork)
    num_preemptions: int = 0
    block_table: list[int] = field(default_factory=list)
    num_encoded_audio: int = 0  # audio positions' embeddings ready (class docstring)
    cached_audio_windows: frozenset[int] = frozenset()  # encoded for free (class docstring)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise InvalidRequest(f"request {self.request_id!r}: empty prompt")
        if self.max_new_tokens < 1:
            raise InvalidRequest(
                f"request {self.request_id!r}: max_new_tokens must be >= 1, "
                f"not {self.max_new_tokens}"
            )
        if not 0 <= self.num_draft_tokens < len(self.prompt_token_ids):
            raise InvalidRequest(
                f"request {self.request_id!r}: {self.num_draft_tokens} draft ids in a "
                f"{len(self.prompt_token_ids)}-token prompt (at most all but one)"
            )
        pos = np.asarray(self.audio_positions, dtype=np.int64)
        if not _increasing_within(pos, len(self.prompt_token_ids)):
            raise InvalidRequest(
                f"request {self.request_id!r}: audio positions must be strictly increasing "
                f"and inside the {len(self.prompt_token_ids)}-token prompt"
            )
        if pos is self.audio_positions and pos.flags.writeable:
            pos = pos.copy()  # the caller's array: a later write of theirs must not reach ours
        pos.flags.writeable = False
        self.audio_positions = pos

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled tokens."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def verify_from(self) -> int:
        """The first position whose logits are sampled: the one before the draft (the last
        prompt position without a draft). A prefill chunk that samples starts at or before it."""
        return self.num_prompt_tokens - self.num_draft_tokens - 1

    @property
    def is_decoding(self) -> bool:
        """True when the only token without KV is the last sampled one (a decode row)."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    @property
    def last_token_id(self) -> int:
        """The newest token: the last output, or the prompt's last id before any output."""
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids [start, end) of prompt + outputs."""
        assert 0 <= start <= end <= self.num_tokens
        p = self.num_prompt_tokens
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        # not the whole prompt + outputs, to slice a few ids of it (a long meeting's ~30k)
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def audio_span_in(self, start: int, end: int) -> tuple[int, int]:
        """(lo, hi): audio_positions[lo:hi] are the positions p with start <= p < end (the
        ones a prefill chunk must splice); audio embedding i goes to audio_positions[i]."""
        lo, hi = np.searchsorted(self.audio_positions, (start, end))
        return int(lo), int(hi)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)


def _increasing_within(positions: np.ndarray, num_tokens: int) -> bool:
    """True for a 1-D, strictly increasing array of positions in [0, num_tokens). Vectorised:
    a 30-minute live hop has ~22,500 positions, checked on the engine thread every hop (a
    C-level pairwise all() took 0.65 ms)."""
    if positions.ndim != 1:
        return False
    if positions.size == 0:
        return True
    inside = positions[0] >= 0 and positions[-1] < num_tokens
    return bool(inside and (positions[1:] > positions[:-1]).all())
