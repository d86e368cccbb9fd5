"""The scripted backend (tests only, DESIGN.md section 3): a known reference transcript, emitted
causally as audio time passes, with injectable faults, so the live layer and the engine
boundary can be tested deterministically without a model.

Each decode of a window [offset, edge] returns the reference segments that overlap it, the one
still running at the edge cut to the fraction of its words spoken so far. Faults are keyed by the
hop number (the n-th `transcribe_window` call of the core, counting from 0):
- `revisions`: at hop h, reference segment i reads `text` instead (a misrecognition);
- `relabel_every` k: at every k-th hop, the labels rotate (S01->S02->...->S01), as a fresh
  decode context numbers speakers differently;
- `eos_hops`: the hypothesis stops after its first segment (early EOS);
- `loop_hops`: the last segment is repeated three more times (a decode loop);
- `fail_hops`: `transcribe_window` raises (one session's decode fails);
- `crash_on_step`: `step()` number n raises outside any session (the engine crashes).

Revision (`SessionOptions.revise`, DESIGN 5.7): the re-decode of a live meeting is `revised`
(absolute times, the re-decode's own labels) where the script gives it, else the reference
with no revision applied, cut to the audio heard; `fail_revise` makes it raise.

A live session re-opened from its stored finals (`SessionOptions.restore`) decodes windows from
their end (`LiveSession`), so a reference segment they hold is not written again, and of one
they cut (a finalize mid-turn) only the words after the cut. Hops count on from the core's
count, not from 0: faults keyed by hop apply to the core, whatever the session.

`ModelConfig(backend="scripted", model=PATH)` loads a script written by `Script.to_json`;
without `model`, `DEFAULT_SCRIPT` serves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.redecode import RedecodeCore
from livemeet.config import ModelConfig
from livemeet.errors import ConfigError
from livemeet.transcriber import BackendInfo, Event, Samples
from livemeet.transcript.segments import Segment

_EPS_S = 1e-3  # s; float slack when comparing segment times with window bounds


@dataclass(frozen=True)
class Revision:
    """At hop `hop`, reference segment `index` reads `text`."""

    hop: int
    index: int
    text: str


@dataclass(frozen=True)
class Script:
    """A reference transcript (absolute times, labels in order of first appearance) plus faults;
    see the module docstring."""

    reference: tuple[Segment, ...]
    revisions: tuple[Revision, ...] = ()
    relabel_every: int = 0
    eos_hops: frozenset[int] = field(default_factory=frozenset)
    loop_hops: frozenset[int] = field(default_factory=frozenset)
    fail_hops: frozenset[int] = field(default_factory=frozenset)
    crash_on_step: int | None = None
    revised: tuple[Segment, ...] | None = None
    fail_revise: bool = False

    def to_json(self) -> str:
        """The script as JSON, read back by `from_json` (the scripted backend's model file)."""
        return json.dumps(
            {
                "reference": [[s.start_s, s.end_s, s.speaker, s.text] for s in self.reference],
                "revisions": [[r.hop, r.index, r.text] for r in self.revisions],
                "relabel_every": self.relabel_every,
                "eos_hops": sorted(self.eos_hops),
                "loop_hops": sorted(self.loop_hops),
                "fail_hops": sorted(self.fail_hops),
                "crash_on_step": self.crash_on_step,
                "revised": None
                if self.revised is None
                else [[s.start_s, s.end_s, s.speaker, s.text] for s in self.revised],
                "fail_revise": self.fail_revise,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Script:
        """Raises ConfigError for malformed JSON or fields."""
        try:
            d = json.loads(text)
            return cls(
                reference=tuple(
                    Segment(float(a), float(b), str(c), str(t)) for a, b, c, t in d["reference"]
                ),
                revisions=tuple(
                    Revision(int(h), int(i), str(t)) for h, i, t in d.get("revisions", [])
                ),
                relabel_every=int(d.get("relabel_every", 0)),
                eos_hops=frozenset(d.get("eos_hops", [])),
                loop_hops=frozenset(d.get("loop_hops", [])),
                fail_hops=frozenset(d.get("fail_hops", [])),
                crash_on_step=d.get("crash_on_step"),
                revised=None
                if d.get("revised") is None
                else tuple(
                    Segment(float(a), float(b), str(c), str(t)) for a, b, c, t in d["revised"]
                ),
                fail_revise=bool(d.get("fail_revise", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid scripted-backend script: {exc}") from exc


DEFAULT_SCRIPT = Script(
    reference=(
        Segment(0.5, 3.0, "S01", "Good morning everyone, let's get started."),
        Segment(3.0, 5.5, "S02", "Thanks. First item is the budget."),
        Segment(5.5, 8.0, "S01", "We are about ten percent over."),
        Segment(8.0, 11.0, "S03", "Then we should cut the travel costs."),
    )
)


def scripted_hypothesis(script: Script, offset_s: float, edge_s: float, hop: int) -> list[Segment]:
    """The scripted backend's decode of the window [offset_s, edge_s] at hop `hop` (pure)."""
    texts = {r.index: r.text for r in script.revisions if r.hop == hop}
    out: list[Segment] = []
    for i, ref in enumerate(script.reference):
        if ref.end_s <= offset_s + _EPS_S or ref.start_s >= edge_s - _EPS_S:
            continue
        words = texts.get(i, ref.text).split()
        span = max(ref.end_s - ref.start_s, _EPS_S)
        first = math.ceil(len(words) * max(0.0, offset_s - ref.start_s) / span - _EPS_S)
        last = math.floor(len(words) * min(1.0, (edge_s - ref.start_s) / span) + _EPS_S)
        if last <= first:
            continue
        out.append(
            replace(
                ref,
                start_s=max(ref.start_s, offset_s),
                end_s=min(ref.end_s, edge_s),
                text=" ".join(words[first:last]),
            )
        )
    if script.relabel_every and hop % script.relabel_every == script.relabel_every - 1:
        labels = sorted({s.speaker for s in script.reference})
        rotate = {a: labels[(k + 1) % len(labels)] for k, a in enumerate(labels)}
        out = [replace(s, speaker=rotate[s.speaker]) for s in out]
    if hop in script.eos_hops:
        out = out[:1]
    if hop in script.loop_hops and out:
        out += [out[-1]] * 3
    return out


class ScriptedCore(RedecodeCore):
    """A `RedecodeCore` that decodes by reading its `Script` (tests only)."""

    def __init__(self, script: Script = DEFAULT_SCRIPT) -> None:
        super().__init__()
        self.script = script
        self.num_hops = 0
        self.num_steps = 0

    @property
    def info(self) -> BackendInfo:
        return BackendInfo(name="scripted", model_id="scripted (tests)", demo=True, revise=True)

    def load(self) -> None:
        pass

    def transcribe_window(
        self, samples: Samples, offset_s: float, prompt: str | None
    ) -> list[Segment]:
        hop, self.num_hops = self.num_hops, self.num_hops + 1
        if hop in self.script.fail_hops:
            raise RuntimeError(f"scripted decode failure at hop {hop}")
        edge_s = offset_s + len(samples) / SAMPLE_RATE
        return scripted_hypothesis(self.script, offset_s, edge_s, hop)

    def revise_meeting(self, duration_s: float, prompt: str | None) -> list[Segment]:
        """The script's `revised` transcript, else its reference as heard (module docstring).
        Raises RuntimeError with `fail_revise`."""
        if self.script.fail_revise:
            raise RuntimeError("scripted revision failure")
        if self.script.revised is not None:
            return [s for s in self.script.revised if s.start_s < duration_s]
        return scripted_hypothesis(
            replace(self.script, revisions=(), relabel_every=0), 0.0, duration_s, -1
        )

    def step(self) -> list[tuple[str, Event]]:
        step, self.num_steps = self.num_steps, self.num_steps + 1
        if step == self.script.crash_on_step:
            raise RuntimeError(f"scripted engine crash at step {step}")
        return super().step()


def create_scripted(config: ModelConfig) -> ScriptedCore:
    """Registry factory: `config.model` is the path of a script JSON file, or None."""
    if config.model is None:
        return ScriptedCore()
    path = Path(config.model)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read scripted-backend script {path}: {exc}") from exc
    return ScriptedCore(Script.from_json(text))
