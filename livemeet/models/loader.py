"""Build a MossTDModel from a safetensors checkpoint (either key dialect) or dummy weights.

Checkpoint names (MODEL.md section 8.1) map to our canonical module names:
  model.whisper_encoder.* | model.audio_tower.*            -> audio_encoder.*
  model.vq_adaptor.layers.{0,2,3}.*                         -> adaptor.{linear_1,linear_2,norm}.*
  model.multi_modal_projector.{linear_1,linear_2,norm}.*    -> adaptor.{linear_1,linear_2,norm}.*
  model.language_model.*                                    -> language_model.*
There is no lm_head.weight: the head is tied to language_model.embed_tokens.weight (one equal
to the embedding is accepted and dropped; one stored instead of the embedding is the embedding).
Every mismatch is reported at once in a ConfigError.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from livemeet.errors import ConfigError
from livemeet.layers.rotary import RotaryEmbedding
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.dialects import PREFIXES, Dialect, canonical_name, checkpoint_key
from livemeet.models.tokenizer import load_tokenizer

_LM_HEAD = "lm_head.weight"
# an unsharded checkpoint's weights; transformers reads it in preference to an index beside it
_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's map of tensors to files
_EMBED = "language_model.embed_tokens.weight"  # ours; the head is tied to it
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# what a cached hub checkpoint must hold: the weights, and the tokenizer and prompt settings
# the engine reads from the same directory (livemeet.models.tokenizer, PromptConfig)
_CHECKPOINT_FILES = (
    "config.json",
    "*.safetensors",
    _INDEX_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "processor_config.json",
)
# Residual-branch output projections get an extra 1/sqrt(2 * layers) in dummy init.
_RESIDUAL_OUTPUTS = ("out_proj.weight", "fc2.weight", "o_proj.weight", "down_proj.weight")


@dataclass(frozen=True)
class _TensorInfo:
    file: Path
    key: str  # name inside the file
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string, e.g. "BF16"


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto" -> cuda when available, else cpu. Raises ConfigError for a name torch does not
    know, or a CUDA device this torch build or machine does not have (torch's own errors for
    them are an AssertionError or a late RuntimeError)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {str(device)!r}: use auto, cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {str(device)!r}: no CUDA GPU is available to this torch build "
                f"({torch.__version__}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s)"
            )
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto" -> bfloat16 on CUDA, float32 elsewhere; names like "bfloat16" -> torch dtypes."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in named:
        raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    return named[dtype]


def load_model(
    path_or_id: str | Path | None,
    *,
    load_format: str = "auto",
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
) -> tuple[MossTDModel, MossTDConfig]:
    """Load MOSS-TD for inference (eval mode, no grad needed). Returns (model, config).

    `path_or_id`: a local checkpoint directory, or a hub id resolved through the local Hugging
    Face cache only (no network). `load_format`: "auto"/"safetensors" reads the checkpoint;
    "dummy" builds random weights of the checkpoint's geometry (real size when path is None).
    Raises ConfigError for a missing/unreadable checkpoint, a config of another model, missing,
    unexpected, misshapen or integer tensors.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    check_torch_cache_dir()
    if load_format == "dummy":
        cfg = (
            MossTDConfig.real_size()
            if path_or_id is None
            else _read_config(resolve_checkpoint(path_or_id))
        )
        model = _empty_model(cfg, dev, dt)
        _init_dummy(model, cfg)
        return model.eval(), cfg
    if load_format not in ("auto", "safetensors"):
        raise ConfigError(f"load_format must be auto, safetensors or dummy, not {load_format!r}")
    if path_or_id is None:
        raise ConfigError("no model given: pass a checkpoint directory or hub id, or use dummy")
    root = resolve_checkpoint(path_or_id)
    cfg = _read_config(root)
    model = _empty_model(cfg, dev, dt)
    tensors = _index_checkpoint(root)
    _check_against_model(model, tensors, root)
    _copy_weights(model, tensors)
    return model.eval(), cfg


def resolve_checkpoint(path_or_id: str | Path) -> Path:
    """The checkpoint directory of `path_or_id`: a local directory as given, a hub id
    (owner/name) as its snapshot in the local Hugging Face cache (never downloaded). The
    weights, the tokenizer and the prompt settings are all read from it. Raises ConfigError
    for neither, or a hub id that is not cached."""
    path = Path(path_or_id).expanduser()
    if _readable_dir(path):
        return path
    text = str(path_or_id)
    if not _HUB_ID.match(text):
        # "is not a directory" read as "exists, but is a file" where it did not exist at all
        what = "is a file, not a checkpoint directory" if path.exists() else "does not exist"
        raise ConfigError(f"model path {text!r} {what} (nor is it a hub id, owner/name)")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(text, local_files_only=True))
    except Exception as exc:  # the hub raises several unrelated types for "not cached"
        raise ConfigError(
            f"model {text!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and "
            f"livemeet does not download at run time. On a machine with network access run "
            f"{download_hint(text)} (with HF_HOME pointing at this cache), or pass the checkpoint "
            f"directory instead ({type(exc).__name__})"
        ) from exc


def check_torch_cache_dir() -> None:
    """Make the cache directory torch makes when it first builds a model (torch._dynamo's
    import, which building on the meta device pulls in): TORCHINDUCTOR_CACHE_DIR, else
    torchinductor_<user> in Python's temporary directory. Raises ConfigError saying what to
    set where there is none: with /tmp read-only and TMPDIR unset, a start failed with
    "backend failed to load: FileNotFoundError(... No usable temporary directory ...)", a
    traceback and exit 1, and `--check-config` with a traceback."""
    try:
        # importing it imports torch._dynamo, which makes the directory as it loads
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        cache_dir()
    except ImportError:  # another torch's layout: the build itself says what it misses
        return
    except OSError as exc:
        raise ConfigError(
            f"torch cannot make its cache directory ({exc}): MOSS-TD needs a writable "
            "temporary directory: point TMPDIR (or TORCHINDUCTOR_CACHE_DIR) at one "
            "(README, Installing as a package)"
        ) from exc


def _readable_dir(path: Path) -> bool:
    """Whether `path` is a directory. Raises ConfigError for one this process may not list or
    enter: a checkpoint copied as root (mode 0700) was a traceback for its service user, from
    the first stat of a file in it."""
    try:
        if not path.is_dir():
            return False
        with os.scandir(path) as entries:
            for entry in entries:
                # entering it (search permission) is what reading its files needs; lstat asks
                # only that: a dangling symlink (a pruned hub-cache blob) is no refusal
                entry.stat(follow_symlinks=False)
                break
    except OSError as exc:
        raise ConfigError(
            f"cannot read checkpoint directory {path}: {exc.strerror or exc}"
        ) from exc
    return True


def check_checkpoint(path_or_id: str | Path) -> MossTDConfig:
    """What `load_model` checks of a checkpoint before it reads a weight: its config.json,
    its shards, and the names, shapes and dtypes in their safetensors headers against the
    model (built on the meta device: nothing allocated). Returns the config. Raises
    ConfigError as `load_model` would."""
    root = resolve_checkpoint(path_or_id)
    cfg = _read_config(root)
    check_torch_cache_dir()
    with torch.device("meta"):
        model = MossTDModel(cfg)
    _check_against_model(model, _index_checkpoint(root), root)
    return cfg


def read_checkpoint_config(path_or_id: str | Path) -> MossTDConfig:
    """The model geometry of a checkpoint directory or cached hub id (its config.json), without
    reading any weights. Raises ConfigError as resolve_checkpoint does, or for a config.json
    that is missing, unreadable or of another model."""
    return _read_config(resolve_checkpoint(path_or_id))


def checkpoint_tokenizer(model: str | None, root: Path | None) -> Tokenizer:
    """The tokenizer of checkpoint `root` (resolved from `model`, a directory or hub id; None
    for both: the built-in one). Raises ConfigError as `load_tokenizer` does, naming for a hub
    snapshot cached with the weights only the command that caches the rest."""
    try:
        return load_tokenizer(root)
    except ConfigError as exc:
        hint = download_hint(model) if model else None
        if hint is None:
            raise
        raise ConfigError(f"{exc.message}; cache the rest with {hint}") from exc


def download_hint(model: str) -> str | None:
    """For a hub id (not a local directory): the `hf download` command that caches every file
    livemeet reads from its checkpoint, else None."""
    if Path(model).expanduser().is_dir() or not _HUB_ID.match(model):
        return None
    # quoted: a shell given `*.safetensors` bare expands it against the files where it runs
    return f"`hf download {model} --include {' '.join(map(shlex.quote, _CHECKPOINT_FILES))}`"


def _read_config(root: Path) -> MossTDConfig:
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"no config.json in {root}")
    return MossTDConfig.from_file(config_file)


def _empty_model(cfg: MossTDConfig, device: torch.device, dtype: torch.dtype) -> MossTDModel:
    with torch.device("meta"):
        model = MossTDModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    # The RoPE table is a non-persistent buffer: rebuild it, it was never in a checkpoint.
    model.language_model.rotary = RotaryEmbedding(cfg.text.head_dim, cfg.text.rope_theta).to(device)
    return model


def _shard_files(root: Path) -> list[Path]:
    """The weight files of checkpoint `root`, in transformers' order of precedence:
    `model.safetensors` alone (an index or other *.safetensors files beside it are not read),
    else the shards `model.safetensors.index.json` lists, else every *.safetensors file.
    Raises ConfigError for a malformed index, a listed shard that is missing, or no file."""
    single = root / _SINGLE_FILE
    if single.is_file():
        return [single]
    index = root / _INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = list(weight_map.values())
        except KeyError as exc:
            raise ConfigError(f"checkpoint index {index} has no 'weight_map'") from exc
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"unreadable checkpoint index {index}: {exc}") from exc
        if not all(isinstance(name, str) for name in names):
            raise ConfigError(f"checkpoint index {index}: weight_map values must be file names")
        files = sorted({root / name for name in names})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError(f"checkpoint shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors files in {root}")
    return files


def _require_readable(file: Path) -> None:
    """Raise ConfigError with the system's reason where `file` cannot be opened: safetensors
    says "No such file or directory" for a shard it may not read (one copied as root, mode
    0600), which `ls` then shows there."""
    try:
        os.close(os.open(file, os.O_RDONLY))
    except OSError as exc:
        raise ConfigError(f"cannot read safetensors file {file}: {exc.strerror or exc}") from exc


def _index_checkpoint(root: Path) -> dict[str, _TensorInfo]:
    tensors: dict[str, _TensorInfo] = {}
    unknown: list[str] = []
    for file in _shard_files(root):
        _require_readable(file)
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    tensor_slice = handle.get_slice(key)
                    name = _LM_HEAD if key == _LM_HEAD else canonical_name(key)
                    if name is None:
                        unknown.append(key)
                        continue
                    if name in tensors:
                        raise ConfigError(f"checkpoint has two tensors for {name}: {key}")
                    info = _TensorInfo(
                        file, key, tuple(tensor_slice.get_shape()), tensor_slice.get_dtype()
                    )
                    tensors[name] = info
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"cannot read safetensors file {file}: {exc}") from exc
    if unknown:
        # the towers' roots in both dialects ("model.vq_adaptor.", not each of its layers)
        roots = [".".join(p.split(".")[:2]) + "." for entry in PREFIXES for p in entry[1:]]
        known = [*dict.fromkeys(roots), _LM_HEAD]
        raise ConfigError(
            f"{len(unknown)} tensors in the checkpoint are under no MOSS-TD key prefix "
            f"(either dialect: {', '.join(known)}): {_some(sorted(unknown))}"
        )
    if _EMBED not in tensors and _LM_HEAD in tensors:
        # A tied pair stored once, under the head's name: safetensors' save_model keeps the
        # first in sort order of the names sharing one tensor. transformers reads it as the
        # embedding too.
        tensors[_EMBED] = tensors.pop(_LM_HEAD)
    return tensors


def _some(names: list[str], limit: int = 8) -> str:
    """The first `limit` of `names` as a list, and how many more (a real checkpoint has 683)."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def _key_in(name: str, dialect: Dialect | None) -> str:
    """Our parameter `name` as a checkpoint of `dialect` keys it; ours without a dialect."""
    if dialect is None:
        return name
    try:
        return checkpoint_key(name, dialect)
    except KeyError:  # outside the three towers
        return name


def _dialect_of(tensors: dict[str, _TensorInfo]) -> Dialect | None:
    """The key dialect of a checkpoint, told by a tower whose prefixes differ between the
    two (the language model's do not); None when no such key is there."""
    for _, upstream, native in PREFIXES:
        if upstream == native:
            continue
        for info in tensors.values():
            if info.key.startswith(upstream):
                return "upstream"
            if info.key.startswith(native):
                return "hf"
    return None


def _expected(model: MossTDModel) -> dict[str, torch.Tensor]:
    return dict(model.state_dict())


def _check_against_model(model: MossTDModel, tensors: dict[str, _TensorInfo], root: Path) -> None:
    """Raise ConfigError for tensors of checkpoint `root` that are missing, unexpected,
    misshapen or not floats."""
    expected = _expected(model)
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected) - {_LM_HEAD})
    if missing:  # named as this checkpoint's dialect names them (ours mean nothing there)
        dialect = _dialect_of(tensors)
        problems.append(f"missing tensors: {[_key_in(n, dialect) for n in missing]}")
    if unexpected:
        problems.append(f"unexpected tensors: {[tensors[n].key for n in unexpected]}")
    for name in sorted(set(expected) & set(tensors)):
        want, got = tuple(expected[name].shape), tensors[name].shape
        if want != got:
            problems.append(f"wrong shape for {tensors[name].key}: expected {want}, got {got}")
    for info in tensors.values():
        if not info.dtype.startswith(("F", "BF")):
            problems.append(f"tensor {info.key} has non-float dtype {info.dtype}")
    if _LM_HEAD in tensors:
        embed = tuple(expected[_EMBED].shape)
        if tensors[_LM_HEAD].shape != embed:
            problems.append(
                f"wrong shape for {_LM_HEAD}: expected {embed}, got {tensors[_LM_HEAD].shape}"
            )
    if problems:
        raise ConfigError(
            f"checkpoint does not match the model config{_single_file_note(root)}: "
            + "; ".join(problems)
        )


def _single_file_note(root: Path) -> str:
    """Where `model.safetensors` was read alone beside an index (`_shard_files`): a note that
    says so, else "". A stale or partial file there (an interrupted copy, a save of another
    layout into the directory) hides complete shards: the error would read as a wrong config."""
    if not ((root / _SINGLE_FILE).is_file() and (root / _INDEX_FILE).is_file()):
        return ""
    return (
        f" ({_SINGLE_FILE} is read alone, as transformers reads it: the shards {_INDEX_FILE} "
        "lists beside it are not; remove whichever is stale)"
    )


def _by_file(tensors: dict[str, _TensorInfo]) -> Iterator[tuple[Path, list[tuple[str, str]]]]:
    files: dict[Path, list[tuple[str, str]]] = {}
    for name, info in tensors.items():
        files.setdefault(info.file, []).append((name, info.key))
    yield from files.items()


@torch.no_grad()
def _copy_weights(model: MossTDModel, tensors: dict[str, _TensorInfo]) -> None:
    params = _expected(model)
    lm_head: torch.Tensor | None = None
    for file, names in _by_file(tensors):
        with safe_open(str(file), framework="pt") as handle:
            for name, key in names:
                if name == _LM_HEAD:
                    lm_head = handle.get_tensor(key)
                    continue
                params[name].copy_(handle.get_tensor(key))
    if lm_head is not None:
        embed = params[_EMBED]
        if not torch.equal(lm_head.to(embed.device, embed.dtype), embed):
            raise ConfigError(
                "checkpoint has an lm_head.weight that differs from embed_tokens; "
                "untied heads are not supported (MOSS-TD ties them)"
            )


@torch.no_grad()
def _init_dummy(model: MossTDModel, cfg: MossTDConfig, seed: int = 0) -> None:
    """Random weights with unit-scale activations: matrices ~ N(0, 1/fan_in), residual output
    projections further / sqrt(2 * layers), embeddings ~ N(0, 1), norms 1, biases 0."""
    first = next(model.parameters())
    gen = torch.Generator(device=first.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            param.zero_()
        elif param.ndim == 1:
            param.fill_(1.0)
        elif "embed" in name:
            param.normal_(0.0, 1.0 if "embed_tokens" in name else 0.02, generator=gen)
        else:
            fan_in = math.prod(param.shape[1:])
            std = fan_in**-0.5
            if name.endswith(_RESIDUAL_OUTPUTS):
                layers = cfg.audio.layers if name.startswith("audio") else cfg.text.layers
                std /= math.sqrt(2 * layers)
            param.normal_(0.0, std, generator=gen)
