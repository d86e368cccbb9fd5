"""Why the Triton q/k kernel's rotated k rows left the reference model's rounding, and the fix.

The reference rotates a bf16 head as torch does (livemeet.layers.rotary; transformers' Qwen3):
cos/sin of the fp32 angle pos * inv_freq rounded to bf16, each product x1 * cos, x2 * sin
rounded to bf16, then their sum rounded. On an H100 (sessions 35-36) the serving path's Triton
kernel stored k rows off that in 15.7 % of the bf16 elements, where the CUDA decode kernel's
prologue matched every one; taking cos/sin in fp64 changed nothing. The compiled PTX showed
why: with fp fusion on (Triton's default), x1 * cos - x2 * sin became one bf16 fma of the
unrounded x1 * cos (`fma.rn.bf16x2`). This study rotates the same rows with the kernel's
arithmetic under each `MODES` setting (fp fusion, cos/sin in fp64) and counts the bf16 outputs
and the bf16 cos/sin that differ from the reference computed on the CPU.

    python -m loadtest.rope_rounding_study [--max-position 100000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from livemeet.layers.rotary import RotaryEmbedding

THETA = 1_000_000.0  # Qwen3's rope_theta (MODEL.md section 4)
HEAD_DIM = 128
# mode -> (enable_fp_fusion, cos/sin of the fp32 angle taken in fp64)
MODES = {
    "fusion on, fp32 cos": (True, False),
    "fusion off, fp32 cos": (False, False),
    "fusion on, fp64 cos": (True, True),
    "fusion off, fp64 cos": (False, True),
}


@triton.jit
def _rotate_kernel(
    X, Positions, InvFreq, Out, Cos, Sin, HALF: tl.constexpr, WIDE: tl.constexpr
):  # fmt: skip
    """One bf16 row [2 * HALF] rotated as fused._norm_rope_head rotates it (no norm)."""
    n = tl.program_id(0)
    cols = tl.arange(0, HALF)
    x1 = tl.load(X + n * 2 * HALF + cols).to(tl.float32)
    x2 = tl.load(X + n * 2 * HALF + HALF + cols).to(tl.float32)
    angle = tl.load(Positions + n).to(tl.float32) * tl.load(InvFreq + cols)
    if WIDE:
        c = libdevice.cos(angle.to(tl.float64)).to(tl.float32)
        s = libdevice.sin(angle.to(tl.float64)).to(tl.float32)
    else:
        c = libdevice.cos(angle)
        s = libdevice.sin(angle)
    c = c.to(tl.bfloat16).to(tl.float32)
    s = s.to(tl.bfloat16).to(tl.float32)
    o1 = (x1 * c).to(tl.bfloat16).to(tl.float32) - (x2 * s).to(tl.bfloat16).to(tl.float32)
    o2 = (x2 * c).to(tl.bfloat16).to(tl.float32) + (x1 * s).to(tl.bfloat16).to(tl.float32)
    tl.store(Out + n * 2 * HALF + cols, o1.to(tl.bfloat16))
    tl.store(Out + n * 2 * HALF + HALF + cols, o2.to(tl.bfloat16))
    tl.store(Cos + n * HALF + cols, c.to(tl.bfloat16))
    tl.store(Sin + n * HALF + cols, s.to(tl.bfloat16))


def reference(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, D] bf16 rotated on the CPU with the reference's roundings: (out, cos, sin)."""
    bf = torch.bfloat16
    angle = positions.cpu().float()[:, None] * inv_freq.cpu().float()[None, :]
    c, s = angle.double().cos().to(bf), angle.double().sin().to(bf)
    half = x.shape[1] // 2
    x1, x2 = x[:, :half].cpu().float(), x[:, half:].cpu().float()
    cf, sf = c.float(), s.float()
    o1 = ((x1 * cf).to(bf).float() - (x2 * sf).to(bf).float()).to(bf)
    o2 = ((x2 * cf).to(bf).float() + (x1 * sf).to(bf).float()).to(bf)
    return torch.cat([o1, o2], dim=1), c, s


def study(max_position: int) -> list[dict[str, object]]:
    """One row per mode: the fraction of bf16 outputs and of bf16 cos/sin off the reference."""
    torch.manual_seed(0)
    inv_freq = RotaryEmbedding(HEAD_DIM, THETA).inv_freq.float().cuda()
    positions = torch.arange(0, max_position, 7, device="cuda")
    x = (2 * torch.randn(positions.shape[0], HEAD_DIM, device="cuda")).to(torch.bfloat16)
    want, want_c, want_s = reference(x, positions, inv_freq)
    rows = []
    for name, (fusion, wide) in MODES.items():
        out = torch.empty_like(x)
        c = torch.empty(x.shape[0], HEAD_DIM // 2, dtype=torch.bfloat16, device="cuda")
        s = torch.empty_like(c)
        _rotate_kernel[(x.shape[0],)](
            x, positions, inv_freq, out, c, s, HALF=HEAD_DIM // 2, WIDE=wide,
            enable_fp_fusion=fusion,
        )  # fmt: skip
        trig_off = (c.cpu() != want_c) | (s.cpu() != want_s)
        rows.append(
            {
                "mode": name,
                "out_off": float((out.cpu() != want).float().mean()),
                "cos_sin_off": float(trig_off.float().mean()),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-position", type=int, default=100_000)
    parser.add_argument("--json", help="append the rows to this JSON-lines file")
    args = parser.parse_args()
    rows = study(args.max_position)
    for row in rows:
        print(
            f"rope rounding {row['mode']:>20}: rotated bf16 off the reference "
            f"{row['out_off']:.3%}, bf16 cos/sin off {row['cos_sin_off']:.3%}"
        )
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
