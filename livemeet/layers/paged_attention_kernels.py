"""The Triton kernels of paged attention, launched by livemeet.layers.paged_attention (whose
docstring gives the KV layout): store-KV, the split-K decode kernel with the merge of its
partials (a kernel of its own, or the last split to finish: livemeet.layers.split_k), and the
causal extend kernel.

Methods: online softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"), FlashAttention-2 tiling (Dao 2023), and Flash-Decoding (Dao et al. 2023, "Flash-Decoding
for long-context inference"): decode splits each sequence's KV into `num_splits` chunks that run
as separate programs, each writing a partial output and its log-sum-exp; a second kernel merges
them. All query heads that share a KV head run in one program, so each KV tile is read once per
group (GQA). The extend kernel packs those heads into the rows of one query tile the same way.

Without Triton (the CPU-only install) HAS_TRITON is False and no kernel is defined. The
kernels keep their leading underscores: profiles and traces match on those names
(loadtest/profile_engine.py, loadtest/pdl_study.py, tests/compile_kernels.py).
"""

from __future__ import annotations

from livemeet.layers import pdl, split_k

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

if HAS_TRITON:

    @triton.jit
    def _store_kv_kernel(
        K,
        V,
        KCache,
        VCache,
        Slots,
        inv_k_scale,
        inv_v_scale,
        stride_kn,
        stride_vn,
        stride_kc_blk,
        stride_kc_tok,
        stride_vc_blk,
        stride_vc_tok,
        ROW: tl.constexpr,  # kv_heads * head_dim; a token's heads are contiguous in both
        ROW_POW2: tl.constexpr,
        PAGE: tl.constexpr,
        FP8: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.dependency_sync(PDL)
        n = tl.program_id(0)
        slot = tl.load(Slots + n)
        if slot >= 0:
            blk = slot // PAGE
            off = slot % PAGE
            cols = tl.arange(0, ROW_POW2)
            cmask = cols < ROW
            k = tl.load(K + n * stride_kn + cols, mask=cmask)
            v = tl.load(V + n * stride_vn + cols, mask=cmask)
            if FP8:
                k = tl.clamp(k.to(tl.float32) * inv_k_scale, -448.0, 448.0)
                v = tl.clamp(v.to(tl.float32) * inv_v_scale, -448.0, 448.0)
            kc = KCache + blk * stride_kc_blk + off * stride_kc_tok + cols
            vc = VCache + blk * stride_vc_blk + off * stride_vc_tok + cols
            tl.store(kc, k.to(KCache.dtype.element_ty), mask=cmask)
            tl.store(vc, v.to(VCache.dtype.element_ty), mask=cmask)

    @triton.jit
    def _kv_tile_rows(
        BT, t0, limit, stride_c_blk, stride_c_tok, PAGE: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        """Cache element offsets of tokens t0..t0+BLOCK_N-1 (t0 a multiple of BLOCK_N): [BLOCK_N].

        BT points at this sequence's block-table row. Tokens at or past `limit` (the caller's
        end) do not read the table (whose row may end, or hold stale ids, past the sequence)
        and give offset 0; callers mask their K/V loads.
        """
        offs = tl.arange(0, BLOCK_N)
        if PAGE % BLOCK_N == 0:
            # the tile lies inside one block: one table read (t0 < limit for every tile)
            blk = tl.load(BT + t0 // PAGE).to(tl.int64)
            return blk * stride_c_blk + ((t0 % PAGE) + offs) * stride_c_tok
        else:
            toks = t0 + offs
            blk = tl.load(BT + toks // PAGE, mask=toks < limit, other=0).to(tl.int64)
            return blk * stride_c_blk + (toks % PAGE) * stride_c_tok

    @triton.jit
    def _online_softmax_step(s, v, m_i, l_i, acc):
        """Fold one KV tile into the running softmax state (Milakov & Gimelshein 2018).

        s: scores [R, BLOCK_N] in the log2 domain, -inf where a key is hidden; v: values
        [BLOCK_N, D] in the dot dtype; m_i, l_i: running max and sum [R]; acc: [R, D] fp32.
        A row that sees nothing yet keeps m = -inf; exp2 never meets (-inf) - (-inf).
        Returns the new (m_i, l_i, acc)."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _decode_split_kernel(
        Q,
        KCache,
        VCache,
        BlockTables,
        SeqLens,
        MidO,
        MidLse,
        Out,
        Counters,
        qk_scale,  # softmax scale * log2(e) * k_scale
        v_scale,
        stride_qb,
        stride_qh,
        stride_ob,
        stride_oh,
        stride_kc_blk,
        stride_kc_tok,
        stride_kc_head,
        stride_vc_blk,
        stride_vc_tok,
        stride_vc_head,
        stride_bt,
        GROUP: tl.constexpr,
        BLOCK_H: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        MID_SPLITS: tl.constexpr,
        FP16_DOT: tl.constexpr,
        MERGE: tl.constexpr,
        FP8_QK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (num_seqs, num_kv_heads, num_splits); MidO [B, H, MID_SPLITS, D] fp32,
        # MidLse [B, H, MID_SPLITS] fp32 (log2 domain), both contiguous.
        # MERGE: 0 = write partials for _decode_merge_kernel; 1 = one split: write Out directly;
        # 2 = write partials, and the last split of (b, kv head) to finish merges them into Out
        # (Counters: int32 [B * kv_heads], zero between calls; see _merge_in_last_split).
        # FP16_DOT (FP8 KV with a 16-bit query): the dot products run in fp16, to which e4m3
        # converts in one instruction per pair on sm_89+ (to bf16 it takes three: the bf16 path
        # made FP8 decode slower than bf16 on an H200, 45 vs 39 us per layer at 36k tokens).
        # fp16 holds e4m3, softmax probabilities and normed queries with more precision than
        # bf16. An fp32 query (tests, the parity path) keeps fp32.
        # FP8_QK (FP8 KV, 16-bit query; opt-in, DecodeKernelConfig): the scores on e4m3 tensor
        # cores with the query scaled per row into e4m3, so K is never converted. Computed as
        # S^T = K Q^T, [BLOCK_N, BLOCK_H]: M = BLOCK_N (64/128) is what Hopper's FP8 MMA needs
        # (with M = 16 Triton falls back to MMAv2 and converts both operands to fp16), and both
        # operands are K-major (head_dim contiguous). The transposed scores then feed the
        # usual softmax; PV stays in fp16.
        pdl.dependency_sync(PDL)  # before the counters too: one decode kernel at a time
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        num_heads = tl.num_programs(1) * GROUP
        seq_len = tl.load(SeqLens + b)
        split_len = tl.cdiv(tl.cdiv(seq_len, tl.num_programs(2)), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, seq_len)

        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        hmask = offs_h < GROUP
        heads = kvh * GROUP + offs_h
        q = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=hmask[:, None],
            other=0.0,
        )  # [BLOCK_H, D]
        if FP16_DOT:
            q = q.to(tl.float16)
        if FP8_QK:
            q_amax = tl.max(tl.abs(q.to(tl.float32)), 1)  # [BLOCK_H]
            q_scale = tl.where(q_amax > 0, q_amax / 448.0, 1.0)
            q8 = (q.to(tl.float32) / q_scale[:, None]).to(KCache.dtype.element_ty)
            row_scale = q_scale[:, None] * qk_scale
        bt = BlockTables + b.to(tl.int64) * stride_bt
        k_base = KCache + kvh * stride_kc_head
        v_base = VCache + kvh * stride_vc_head

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        for t0 in range(start, end, BLOCK_N):
            tmask = (t0 + tl.arange(0, BLOCK_N)) < end
            k_rows = _kv_tile_rows(bt, t0, end, stride_kc_blk, stride_kc_tok, PAGE, BLOCK_N)
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0)
            if FP8_QK:
                s = tl.trans(tl.dot(k, tl.trans(q8))) * row_scale  # [BLOCK_H, BLOCK_N]
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
            s = tl.where(tmask[None, :], s, float("-inf"))
            v_rows = _kv_tile_rows(bt, t0, end, stride_vc_blk, stride_vc_tok, PAGE, BLOCK_N)
            v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_step(s, v.to(q.dtype), m_i, l_i, acc)

        # an empty split (start >= end) leaves l_i = 0: it writes 0 and lse = -inf
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        if MERGE == 1:
            out_ptrs = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(out_ptrs, (out * v_scale).to(Out.dtype.element_ty), mask=hmask[:, None])
        else:
            lse = m_i + tl.math.log2(l_i)
            row = (b * num_heads + heads) * MID_SPLITS + split  # [BLOCK_H]
            tl.store(MidO + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=hmask[:, None])
            tl.store(MidLse + row, lse, mask=hmask)
            if MERGE == 2:
                _merge_in_last_split(
                    MidO, MidLse, Out + b * stride_ob + kvh * GROUP * stride_oh,
                    Counters + b * tl.num_programs(1) + kvh, v_scale, stride_oh,
                    (b * num_heads + kvh * GROUP) * MID_SPLITS, GROUP, HEAD_DIM, MID_SPLITS,
                )  # fmt: skip

    @triton.jit
    def _merge_in_last_split(
        MidO,
        MidLse,
        OutGroup,
        Counter,
        v_scale,
        stride_oh,
        first_row,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        MID_SPLITS: tl.constexpr,
    ):
        """Count this split as done; the last of the sequence's splits for this KV head merges
        every split's partial into the GROUP heads' outputs (OutGroup + h * stride_oh; partials
        in rows first_row + h * MID_SPLITS + s of MidO/MidLse) and re-arms the counter (a
        split-K semaphore: livemeet.layers.split_k). This removes the merge kernel's launch
        from each decode step."""
        if split_k.arrive_last(Counter, tl.num_programs(2)):
            offs_d = tl.arange(0, HEAD_DIM)
            for h in tl.static_range(GROUP):
                row0 = first_row + h * MID_SPLITS
                out = _merge_splits(MidO, MidLse, row0, tl.num_programs(2), HEAD_DIM, MID_SPLITS)
                out_ptrs = OutGroup + h * stride_oh + offs_d
                tl.store(out_ptrs, (out * v_scale).to(OutGroup.dtype.element_ty))
            split_k.rearm(Counter)

    @triton.jit
    def _merge_splits(
        MidO, MidLse, row0, num_splits, HEAD_DIM: tl.constexpr, MID_SPLITS: tl.constexpr
    ):
        """One head's output [HEAD_DIM] fp32 (before v_scale) from its first `num_splits`
        partials: rows row0..row0+num_splits-1 of MidO [., HEAD_DIM] / MidLse (log2 domain),
        weighted by exp2(lse - max lse); empty splits (lse -inf) weigh 0 and a head with no
        live split gives 0. Loads go through L2 (".cg"), as the in-kernel merge needs."""
        offs_s = tl.arange(0, MID_SPLITS)
        offs_d = tl.arange(0, HEAD_DIM)
        smask = offs_s < num_splits
        rows = row0 + offs_s
        lse = tl.load(MidLse + rows, mask=smask, other=float("-inf"), cache_modifier=".cg")
        lse_max = tl.max(lse, 0)
        lse_max = tl.where(lse_max > float("-inf"), lse_max, 0.0)
        w = tl.where(lse > float("-inf"), tl.math.exp2(lse - lse_max), 0.0)
        denom = tl.sum(w, 0)
        o = tl.load(
            MidO + rows[:, None] * HEAD_DIM + offs_d[None, :],
            mask=smask[:, None],
            other=0.0,
            cache_modifier=".cg",
        )  # [S, D]
        return tl.sum(w[:, None] * o, 0) / tl.where(denom > 0, denom, 1.0)

    @triton.jit
    def _decode_merge_kernel(
        MidO,
        MidLse,
        Out,
        v_scale,
        num_splits,
        stride_ob,
        stride_oh,
        HEAD_DIM: tl.constexpr,
        MID_SPLITS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (num_seqs, num_heads)
        pdl.dependency_sync(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        row0 = (b * tl.num_programs(1) + h) * MID_SPLITS
        out = _merge_splits(MidO, MidLse, row0, num_splits, HEAD_DIM, MID_SPLITS) * v_scale
        offs_d = tl.arange(0, HEAD_DIM)
        tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty))

    @triton.jit
    def _extend_kernel(
        Q,
        KCache,
        VCache,
        BlockTables,
        CuSeqlensQ,
        SeqLens,
        Out,
        qk_scale,  # softmax scale * log2(e) * k_scale
        v_scale,
        stride_qt,
        stride_qh,
        stride_ot,
        stride_oh,
        stride_kc_blk,
        stride_kc_tok,
        stride_kc_head,
        stride_vc_blk,
        stride_vc_tok,
        stride_vc_head,
        stride_bt,
        GROUP: tl.constexpr,
        GROUP_POW2: tl.constexpr,
        BLOCK_M: tl.constexpr,  # query tokens per tile; rows = BLOCK_M * GROUP_POW2
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        FP16_DOT: tl.constexpr,
    ):
        # grid: (num_seqs, num_kv_heads, cdiv(max_seqlen_q, BLOCK_M))
        # FP16_DOT (FP8 KV with a 16-bit query): dots in fp16, as in _decode_split_kernel
        # (e4m3 -> fp16 is one instruction per pair on sm_89+, e4m3 -> bf16 three)
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        mt = tl.program_id(2)
        q_start = tl.load(CuSeqlensQ + b)
        q_len = tl.load(CuSeqlensQ + b + 1) - q_start
        if mt * BLOCK_M >= q_len:
            return
        seq_len = tl.load(SeqLens + b)
        prefix_len = seq_len - q_len

        ROWS: tl.constexpr = BLOCK_M * GROUP_POW2
        rows = tl.arange(0, ROWS)
        tok = mt * BLOCK_M + rows // GROUP_POW2  # new-token index within the sequence
        head_in_group = rows % GROUP_POW2
        rmask = (tok < q_len) & (head_in_group < GROUP)
        heads = kvh * GROUP + head_in_group
        offs_d = tl.arange(0, HEAD_DIM)
        q_tok = (q_start + tok).to(tl.int64)
        q = tl.load(
            Q + q_tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=rmask[:, None],
            other=0.0,
        )  # [ROWS, D]
        if FP16_DOT:
            q = q.to(tl.float16)
        q_pos = prefix_len + tok
        bt = BlockTables + b.to(tl.int64) * stride_bt
        k_base = KCache + kvh * stride_kc_head
        v_base = VCache + kvh * stride_vc_head

        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
        # keys before the tile's first query position are visible to every row: no mask
        full_end = (prefix_len + mt * BLOCK_M) // BLOCK_N * BLOCK_N
        for t0 in range(0, full_end, BLOCK_N):
            k_rows = _kv_tile_rows(bt, t0, full_end, stride_kc_blk, stride_kc_tok, PAGE, BLOCK_N)
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :])
            s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
            v_rows = _kv_tile_rows(bt, t0, full_end, stride_vc_blk, stride_vc_tok, PAGE, BLOCK_N)
            v = tl.load(v_base + v_rows[:, None] + offs_d[None, :])
            m_i, l_i, acc = _online_softmax_step(s, v.to(q.dtype), m_i, l_i, acc)
        # the diagonal band: causal mask
        band_end = tl.minimum(seq_len, prefix_len + (mt + 1) * BLOCK_M)
        for t0 in range(full_end, band_end, BLOCK_N):
            k_pos = t0 + tl.arange(0, BLOCK_N)
            kmask = k_pos < band_end
            k_rows = _kv_tile_rows(bt, t0, band_end, stride_kc_blk, stride_kc_tok, PAGE, BLOCK_N)
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kmask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
            visible = kmask[None, :] & (k_pos[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))  # a padded row may see nothing here
            v_rows = _kv_tile_rows(bt, t0, band_end, stride_vc_blk, stride_vc_tok, PAGE, BLOCK_N)
            v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kmask[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_step(s, v.to(q.dtype), m_i, l_i, acc)

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
        tl.store(
            Out + q_tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=rmask[:, None],
        )
