"""The tensor-core split-K decode kernel (`csrc/decode_attention.cu`): run-time compilation with
NVRTC and launches through the CUDA driver, both over ctypes.

Why not Triton: the Triton decode kernel pads the GQA group to 16 tensor-core rows and stages
every K/V tile through shared memory; for an FP8 cache it is bound by that staging and the
e4m3 conversion (~40 us per layer at 36k tokens on an H200, bf16's time for half the bytes).
The CUDA kernel loads each lane's pieces of K and V straight into its mma.sync operand
registers (see the .cu file's header). It writes the same partials (`mid_o`, `mid_lse`) as
the Triton split kernel, so the Triton merge kernel can finish both; given split-K counters,
its last split to finish merges them instead (the default for both cache dtypes since
session 39).

Launches carry the programmatic-stream-serialization attribute (PDL, as
`livemeet.layers.pdl` gives the Triton kernels), so the kernel takes part in the decode
step's launch chain, in CUDA graphs too (cuLaunchKernelEx is capturable).

The kernel is used where `supported` says so: an sm_90+ GPU, a bf16 query, head_dim 128, at
most 8 query heads per KV head, blocks of a multiple of 16 tokens, a bf16 or float8_e4m3fn
cache, NVRTC and the driver found, and `LIVEMEET_DECODE_KERNEL` not set to `triton`.
Everything else runs the Triton kernel, as do tensor views whose alignment the kernel's vector
loads cannot take (`layout_supported`). Compilation happens once per `Variant` and device and
takes ~1 s. Figures: docs/benchmarks.md, session 7.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import pdl

log = logging.getLogger(__name__)

KERNEL_ENV = "LIVEMEET_DECODE_KERNEL"  # "cuda" (default where supported) or "triton"
SOURCE = Path(__file__).parent / "csrc" / "decode_attention.cu"
KERNEL_NAME = b"livemeet_decode_split"
HEAD_DIM = 128  # the kernel's fixed head size (Qwen3's)
MAX_GROUP = 8  # query heads per KV head the kernel's m16 tile holds
TILE_KEYS = 16  # keys per warp iteration: a KV block must hold whole tiles
THREADS = 128  # 4 warps per program
MIN_CAPABILITY = (9, 0)  # griddepcontrol (PDL) and e4m3 conversion instructions
PIECE_BYTES = 16  # the kernel's K/V load width
MAX_MERGE_SPLITS = 64  # splits the in-kernel merge takes (the .cu file's MERGE_SPLITS)
MIN_STAGES = 2
MAX_STAGES_BF16 = 2  # 3 spills registers (ptxas, sm_90: 255 registers, 180 bytes spilled)
MAX_STAGES_FP8 = 4  # 232 registers at 4, no spill
DEFAULT_STAGES_BF16 = 2
DEFAULT_STAGES_FP8 = 2  # 3 programs per SM; 3 stages fit only 2 (299 vs 363 us at 16x36k)
EARLY_LOADS = True  # reads before the PDL wait: see the .cu file's kernel entry
# The grid's fastest index: the KV head (True) or the split. Kernel alone on an H200 (session
# 13, docs/benchmarks.md), us per layer, KV head / split fastest: FP8 16x36k 293.4 / 294.6-295.7,
# bf16 1x36k 40.2 / 40.6, FP8 4x36k 79.6 / 80.3, FP8 1x36k 27.3 / 27.2, bf16 16x36k 534.2 / 534.3
HEADS_INNER = True
# CUDA driver API constants (cuda.h, CUDA 12/13)
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an enum id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [
        ("grid_x", ctypes.c_uint),
        ("grid_y", ctypes.c_uint),
        ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint),
        ("block_y", ctypes.c_uint),
        ("block_z", ctypes.c_uint),
        ("shared_mem_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


# The kernel's parameters in order (the .cu file's livemeet_decode_split signature): 8 pointers
# (q, k_cache, v_cache, tables, seq_lens, mid_o, mid_lse, out), 2 floats (qk_scale, v_scale),
# 7 int64 strides, 2 ints (group, mid_splits), the counters pointer; then FUSED_QK's (0 in
# every other form): k_new, v_new, their 2 int64 strides, q_norm_w, k_norm_w, positions,
# inv_freq, slots, 2 floats (eps, kv_inv_scale).
PARAM_TYPES: tuple[type[ctypes._SimpleCData], ...] = (
    *([ctypes.c_void_p] * 8),
    ctypes.c_float,
    ctypes.c_float,
    *([ctypes.c_int64] * 7),
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    *([ctypes.c_void_p] * 5),
    ctypes.c_float,
    ctypes.c_float,
)
# indices of the per-layer FUSED_QK parameters in PARAM_TYPES
_K_NEW, _V_NEW, _NEW_STRIDE_B, _NEW_STRIDE_H, _Q_NORM_W, _K_NORM_W = range(20, 26)


class LaunchArgs:
    """The kernel's parameters as ctypes values and the void* array pointing at them, made once
    per `PreparedLaunch` and refilled per layer. Building twenty ctypes objects and casting a
    pointer to each on every launch was ~16 % of the engine's host time in steps that launch
    eagerly (a prefill step runs 28 decode launches; py-spy of 128 live sessions,
    docs/benchmarks.md session 13). Refilling is safe because cuLaunchKernelEx copies the
    values at the call (and into the node during a graph capture)."""

    def __init__(self) -> None:
        self.values = [t() for t in PARAM_TYPES]
        self.params = (ctypes.c_void_p * len(PARAM_TYPES))(
            *[ctypes.addressof(v) for v in self.values]
        )

    def fill(self, *args: int | float) -> ctypes.Array[ctypes.c_void_p]:
        """Set the values (in PARAM_TYPES order; pointers as ints, 0 for null); returns the
        array to pass as the kernel's parameters. Raises InternalError on a wrong count."""
        if len(args) != len(self.values):
            raise InternalError(f"the decode kernel takes {len(self.values)} parameters")
        for slot, value in zip(self.values, args, strict=True):
            slot.value = value
        return self.params


# The PDL launch attribute, constant (the driver only reads it during a launch).
_PDL_ATTR = _LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
_PDL_ATTR.value = (1).to_bytes(4, "little")  # programmaticStreamSerializationAllowed = 1
_PDL_ATTR_POINTER = ctypes.pointer(_PDL_ATTR)


def _enabled_by_env() -> bool:
    return os.environ.get(KERNEL_ENV, "cuda") != "triton"


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(NVRTC, the CUDA driver); OSError when either is missing."""
    major = (torch.version.cuda or "13").split(".")[0]
    nvrtc = None
    for name in (f"libnvrtc.so.{major}", "libnvrtc.so"):
        try:
            nvrtc = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if nvrtc is None:
        raise OSError("NVRTC (libnvrtc) not found")
    return nvrtc, ctypes.CDLL("libcuda.so.1")


def _check_driver(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(msg))
        raise InternalError(f"{what} failed: {(msg.value or b'?').decode()} ({result})")


def compile_cubin(variant: Variant, capability: tuple[int, int]) -> bytes:
    """The kernel compiled for one variant and sm_XY. Raises InternalError with NVRTC's log
    when compilation fails, OSError when NVRTC is missing."""
    nvrtc, _ = _libraries()
    prog = ctypes.c_void_p()
    src = SOURCE.read_bytes()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"decode_attention.cu", 0, None, None):
        raise InternalError("nvrtcCreateProgram failed")
    try:
        opts = [
            f"--gpu-architecture=sm_{capability[0]}{capability[1]}".encode(),
            b"-std=c++17",
            f"-DKV_FP8={int(variant.fp8)}".encode(),
            f"-DPAGE={variant.page}".encode(),
            f"-DNUM_STAGES={variant.stages}".encode(),
            f"-DEARLY_LOADS={int(variant.early_loads)}".encode(),
            f"-DHEADS_INNER={int(variant.heads_inner)}".encode(),
            f"-DFUSED_QK={int(variant.fused_qk)}".encode(),
        ]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        if nvrtc.nvrtcCompileProgram(prog, len(opts), arr):
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, text)
            raise InternalError(f"decode kernel compilation failed:\n{text.value.decode()}")
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


@dataclass(frozen=True)
class Variant:
    """One compiled form of the kernel: cache dtype, KV block size (tokens), register pipeline
    depth (tiles per warp, >= 2; bf16 spills past 2), whether the first tiles load before
    the PDL wait, whether the KV head is the grid's fastest index (`heads_inner`: grid
    (kv_heads, num_splits, B), so a (sequence, split)'s programs are dispatched together), and
    whether it takes q, k, v raw and does the q/k RMSNorm, RoPE and K/V store itself
    (`fused_qk`: `FusedQK`)."""

    fp8: bool
    page: int
    stages: int
    early_loads: bool
    heads_inner: bool = HEADS_INNER
    fused_qk: bool = False

    def __post_init__(self) -> None:
        if not MIN_STAGES <= self.stages <= (MAX_STAGES_FP8 if self.fp8 else MAX_STAGES_BF16):
            raise ConfigError(f"{self.stages} pipeline stages are not supported for this cache")
        if self.page % TILE_KEYS:
            raise ConfigError(f"KV blocks of {self.page} tokens do not hold whole 16-key tiles")


def default_variant(fp8: bool, page: int) -> Variant:
    """The form `paged_decode_attention` runs unless a DecodeKernelConfig says otherwise."""
    stages = DEFAULT_STAGES_FP8 if fp8 else DEFAULT_STAGES_BF16
    return Variant(fp8, page, stages, EARLY_LOADS, HEADS_INNER)


@dataclass(frozen=True)
class FusedQK:
    """A decode step's inputs for the `fused_qk` kernel, the same for every layer: positions
    (int64 [B], the RoPE position of each row's token), inv_freq (fp32 [64]: RoPE's inverse
    frequencies for head_dim 128), slots (int64 [B]: the new token's cache slot, block *
    block_size + offset, -1 for a padding row), the RMSNorm eps, and the reciprocal of the KV
    scale (an FP8 cache stores clamp(x * kv_inv_scale, -448, 448))."""

    positions: torch.Tensor
    inv_freq: torch.Tensor
    slots: torch.Tensor
    eps: float
    kv_inv_scale: float

    def check(self, batch: int) -> None:
        """Raises InternalError for tensors the kernel cannot take."""
        for name, t, dtype, n in (
            ("positions", self.positions, torch.int64, batch),
            ("slots", self.slots, torch.int64, batch),
            ("inv_freq", self.inv_freq, torch.float32, HEAD_DIM // 2),
        ):
            if t.dtype != dtype or t.dim() != 1 or t.shape[0] != n or t.stride(0) != 1:
                raise InternalError(f"fused q/k: {name} must be contiguous {dtype} [{n}]")


@dataclass(frozen=True)
class FusedQKLayer:
    """One layer's tensors for the `fused_qk` kernel: k and v raw ([B, kv_heads, 128] bf16
    views with one stride pair, 4-byte aligned: the qkv projection's output), the q and k
    RMSNorm weights (bf16 [128], contiguous)."""

    k: torch.Tensor
    v: torch.Tensor
    q_norm_weight: torch.Tensor
    k_norm_weight: torch.Tensor

    def fits(self) -> bool:
        """Whether the kernel's loads can take these tensors (else: the unfused path)."""
        k, v = self.k, self.v
        if k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16 or k.stride() != v.stride():
            return False
        if k.shape != v.shape or k.shape[2] != HEAD_DIM or k.stride(2) != 1:
            return False
        if (k.data_ptr() | v.data_ptr()) % 4 or k.stride(0) % 2 or k.stride(1) % 2:
            return False
        return all(
            w.dtype == torch.bfloat16 and w.shape == (HEAD_DIM,) and w.stride(0) == 1
            and w.data_ptr() % 4 == 0
            for w in (self.q_norm_weight, self.k_norm_weight)
        )  # fmt: skip


@dataclass(frozen=True)
class _Kernel:
    module: ctypes.c_void_p
    function: ctypes.c_void_p


@functools.cache
def _kernel(variant: Variant, device_index: int) -> _Kernel:
    capability = torch.cuda.get_device_capability(device_index)
    cubin = compile_cubin(variant, capability)
    _, cuda = _libraries()
    # cudaSetDevice (inside torch.cuda.device) makes the device's primary context current on
    # this thread; nothing here is a stream operation, so this is safe inside a graph capture
    with torch.cuda.device(device_index):
        module = ctypes.c_void_p()
        _check_driver(cuda, cuda.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        found = cuda.cuModuleGetFunction(ctypes.byref(fn), module, KERNEL_NAME)
        _check_driver(cuda, found, "cuModuleGetFunction")
    return _Kernel(module, fn)


@functools.cache
def usable(variant: Variant, device_index: int) -> bool:
    """Whether this form of the kernel compiles and loads on the device (logged once when it
    does not: NVRTC or the driver missing, a compile or load error); callers then run Triton."""
    try:
        _kernel(variant, device_index)
    except (OSError, InternalError, AttributeError, RuntimeError) as exc:
        log.warning("CUDA decode kernel %s unavailable, using Triton: %s", variant, exc)
        return False
    return True


@functools.cache
def programs_per_sm(variant: Variant, device_index: int) -> int:
    """How many programs of this variant fit on one SM at once (the driver's occupancy
    calculator: registers and shared memory), the unit `choose_num_splits` fills waves in."""
    _, cuda = _libraries()
    count = ctypes.c_int()
    fn = _kernel(variant, device_index).function
    found = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), fn, THREADS, 0)
    _check_driver(cuda, found, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return max(1, count.value)


def supported(q_dtype: torch.dtype, k_cache: torch.Tensor, group: int) -> bool:
    """Whether `PreparedLaunch` can run a decode with this query dtype over this cache (see the
    module docstring)."""
    if not (_enabled_by_env() and k_cache.is_cuda and q_dtype == torch.bfloat16):
        return False
    if k_cache.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        return False
    page, head_dim = k_cache.shape[1], k_cache.shape[3]
    if head_dim != HEAD_DIM or group > MAX_GROUP or page % TILE_KEYS:
        return False
    return _device_supports(device_index(k_cache), k_cache.dtype == torch.float8_e4m3fn, page)


@functools.cache
def _device_supports(index: int, fp8: bool, page: int) -> bool:
    """The device-dependent part of `supported`, once per (device, dtype, block size): it is
    asked per layer of every eagerly launched step."""
    if torch.cuda.get_device_capability(index) < MIN_CAPABILITY:
        return False
    return usable(default_variant(fp8, page), index)


def layout_supported(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor
) -> bool:
    """Whether the tensors' addresses and strides suit the kernel's loads: 16-byte K/V pieces
    (both caches' bases, block and token strides on 16-byte boundaries, and one stride pair for
    both), 4-byte query pairs (q's base and its batch and head strides), and contiguous output
    rows. A view that fails this runs on Triton, which has no such needs (a misaligned vector
    load would stop the CUDA context)."""
    elem = k_cache.element_size()
    if k_cache.stride() != v_cache.stride():
        return False
    for t in (k_cache, v_cache):
        if t.data_ptr() % PIECE_BYTES or any(st * elem % PIECE_BYTES for st in t.stride()[:2]):
            return False
    if q.data_ptr() % 4 or q.stride(0) % 2 or q.stride(1) % 2 or q.stride(2) != 1:
        return False
    return out.stride(2) == 1


def device_index(t: torch.Tensor) -> int:
    """The CUDA device index of `t` (the current device for an index-less cuda tensor)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


class PreparedLaunch:
    """One step's decode launch resolved once, run per layer: the kernel, grid, stream and
    every parameter but the per-layer tensors (q, the layer's caches, out) are fixed here, so
    a layer's launch sets eight parameter values and calls the driver. In a step that
    launches attention eagerly between graph pieces (28 layers), resolving all of that per
    layer was ~60 us of the ~316 us of host time per layer (py-spy of 100 live sessions,
    docs/benchmarks.md session 16).

    `k_cache` gives the geometry every layer's caches must share (shape, strides, dtype);
    block_tables [B, max_blocks] and seq_lens [B] int32; mid_o [B, H, S, 128] and mid_lse
    [B, H, S] fp32 contiguous with S >= num_splits; qk_scale: softmax scale * log2(e) *
    k_scale. With one split a call writes `out` (x v_scale) directly, else the partials for
    the merge. `variant` (default: `default_variant`) must match the cache's dtype and block
    size. `counters` (int32, >= B x kv_heads, zero between calls: `split_k.counters`): the
    last split of each (sequence, KV head) merges the partials into `out` itself (at most
    MAX_MERGE_SPLITS splits); None leaves the partials. `launch_early` False launches without
    the PDL attribute even where PDL is on (the kernel still lets its successor launch early).
    The stream is the current one when the launch is prepared: run it on that stream only
    (`StepAttention` is made per forward, inside any graph capture). It keeps the step's
    tensors whose addresses it holds alive. Raises InternalError on a
    variant that does not match the cache, too many splits for the in-kernel merge, or
    tensors whose alignment the kernel's loads cannot take.

    Hazard (early loads, PDL): the kernel may start before the kernels ahead of it in the
    stream have finished, and it reads seq_lens, the block tables and the KV of every token but
    each sequence's last before waiting for them. So no PDL-launched kernel of the same step
    may write those: in the engine they are host copies made before the step, and the step's
    K/V store (the q/k rotation kernel through a `KVSink`, or store_kv) writes only the new
    token (the last one). Layers may share mid_o and mid_lse: a layer's kernel writes them only
    after its PDL wait, when every kernel ahead of it, the previous layer's merge included,
    has finished."""

    def __init__(
        self,
        k_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        mid_o: torch.Tensor,
        mid_lse: torch.Tensor,
        *,
        batch: int,
        num_splits: int,
        group: int,
        qk_scale: float,
        v_scale: float,
        variant: Variant | None = None,
        counters: torch.Tensor | None = None,
        launch_early: bool = True,
        fused: FusedQK | None = None,
    ) -> None:
        fp8 = k_cache.dtype == torch.float8_e4m3fn
        variant = variant or default_variant(fp8, k_cache.shape[1])
        if (variant.fp8, variant.page) != (fp8, k_cache.shape[1]):
            raise InternalError(f"{variant} does not match the cache ({k_cache.dtype}, blocks of "
                                f"{k_cache.shape[1]})")  # fmt: skip
        if variant.fused_qk != (fused is not None):
            raise InternalError("a fused_qk variant needs its FusedQK inputs, and only it")
        if fused is not None:
            fused.check(batch)
        if counters is not None and num_splits > MAX_MERGE_SPLITS:
            raise InternalError(f"the in-kernel merge takes at most {MAX_MERGE_SPLITS} splits")
        elem = k_cache.element_size()
        if any(st * elem % PIECE_BYTES for st in k_cache.stride()[:2]):
            raise InternalError("the cache's block and token strides do not suit the kernel")
        # the tensors whose addresses the parameters hold stay alive as long as the launch
        self._tensors = (block_tables, seq_lens, mid_o, mid_lse, counters, fused)
        self.fused_qk = variant.fused_qk
        self.cache_shape = k_cache.shape
        self.cache_stride = k_cache.stride()
        self.cache_dtype = k_cache.dtype
        self.batch = batch
        self.device_index = device_index(k_cache)
        self.function = _kernel(variant, self.device_index).function
        self.driver = _libraries()[1]
        self.args = LaunchArgs()  # its own: the values below stay set between layers
        self.args.fill(
            0, 0, 0,  # q, k_cache, v_cache: per layer
            block_tables.data_ptr(),
            seq_lens.data_ptr(),
            mid_o.data_ptr(),
            mid_lse.data_ptr(),
            0,  # out: per layer
            qk_scale,
            v_scale,
            0, 0, 0, 0,  # q and out strides: per layer
            k_cache.stride(0),
            k_cache.stride(1),
            block_tables.stride(0),
            group,
            mid_o.shape[2],
            counters.data_ptr() if counters is not None else 0,
            0, 0, 0, 0, 0, 0,  # FUSED_QK's k_new, v_new, strides, norm weights: per layer
            fused.positions.data_ptr() if fused else 0,
            fused.inv_freq.data_ptr() if fused else 0,
            fused.slots.data_ptr() if fused else 0,
            fused.eps if fused else 0.0,
            fused.kv_inv_scale if fused else 0.0,
        )  # fmt: skip
        use_pdl = launch_early and pdl.is_enabled()
        num_kv_heads = k_cache.shape[2]
        inner, outer = (
            (num_kv_heads, num_splits) if variant.heads_inner else (num_splits, num_kv_heads)
        )
        stream = torch.cuda.current_stream(k_cache.device).cuda_stream
        self.config = _LaunchConfig(
            grid_x=inner,
            grid_y=outer,
            grid_z=batch,
            block_x=THREADS,
            block_y=1,
            block_z=1,
            shared_mem_bytes=0,
            stream=ctypes.c_void_p(stream),
            attrs=_PDL_ATTR_POINTER if use_pdl else None,
            num_attrs=1 if use_pdl else 0,
        )
        self.config_ref = ctypes.byref(self.config)

    def accepts(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor
    ) -> bool:
        """Whether a call can launch over these tensors: caches of the prepared geometry,
        q of the prepared batch, and addresses and strides the kernel's loads can take (as
        `layout_supported`; the cache strides were checked with the geometry)."""
        for cache in (k_cache, v_cache):
            if (
                cache.shape != self.cache_shape
                or cache.stride() != self.cache_stride
                or cache.dtype != self.cache_dtype
            ):
                return False
        return not (
            q.shape[0] != self.batch
            or (k_cache.data_ptr() | v_cache.data_ptr()) % PIECE_BYTES
            or q.data_ptr() % 4
            or q.stride(0) % 2
            or q.stride(1) % 2
            or q.stride(2) != 1
            or out.stride(2) != 1
        )

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        layer: FusedQKLayer | None = None,
    ) -> None:
        """Launch over one layer: q [B, H, 128] and out [B, H, 128] (views contiguous in
        head_dim), that layer's caches; a `fused_qk` launch takes q raw and the layer's raw k,
        v and norm weights (`layer`, whose `fits` the caller checked). Raises InternalError
        where `accepts` is False, or `layer` is missing or given to an unfused launch."""
        if not self.accepts(q, k_cache, v_cache, out):
            raise InternalError(
                "the tensors' geometry, alignment or strides do not suit the kernel"
            )
        values = self.args.values
        if self.fused_qk != (layer is not None):
            raise InternalError("a fused_qk launch takes the layer's raw k, v and norms, only it")
        if layer is not None:
            values[_K_NEW].value = layer.k.data_ptr()
            values[_V_NEW].value = layer.v.data_ptr()
            values[_NEW_STRIDE_B].value = layer.k.stride(0)
            values[_NEW_STRIDE_H].value = layer.k.stride(1)
            values[_Q_NORM_W].value = layer.q_norm_weight.data_ptr()
            values[_K_NORM_W].value = layer.k_norm_weight.data_ptr()
        values[0].value = q.data_ptr()
        values[1].value = k_cache.data_ptr()
        values[2].value = v_cache.data_ptr()
        values[7].value = out.data_ptr()
        values[10].value = q.stride(0)
        values[11].value = q.stride(1)
        values[12].value = out.stride(0)
        values[13].value = out.stride(1)
        # the function belongs to the device's primary context, which must be current
        # (switching devices only when another one is)
        if torch.cuda.current_device() == self.device_index:
            found = self.driver.cuLaunchKernelEx(
                self.config_ref, self.function, self.args.params, None
            )
        else:
            with torch.cuda.device(self.device_index):
                found = self.driver.cuLaunchKernelEx(
                    self.config_ref, self.function, self.args.params, None
                )
        _check_driver(self.driver, found, "cuLaunchKernelEx")
