// Split-K paged decode attention on tensor cores, for one query token per sequence.
// Compiled at run time by NVRTC (livemeet/layers/cuda_decode.py); no headers needed.
//
// Contract (the same as the Triton kernel in livemeet/layers/paged_attention_kernels.py):
//   q        bf16 [B, H, 128] (strides in elements)
//   caches   [num_blocks, PAGE, KV_HEADS, 128], bf16 or float8_e4m3fn (KV_FP8); a token's
//            heads are contiguous (stride_tok elements), blocks stride_blk elements apart
//   tables   int32 [B, stride_bt]; seq_lens int32 [B] (0: the row is padding)
//   grid     (num_splits, KV_HEADS, B), or (KV_HEADS, num_splits, B) with HEADS_INNER;
//            128 threads (NUM_WARPS warps)
//   out      bf16 [B, H, 128] when num_splits == 1, else the partials
//            mid_o fp32 [B, H, mid_splits, 128] (normalised) and mid_lse fp32 [B, H,
//            mid_splits] (log2 domain), merged by the Triton merge kernel, or (counters:
//            int32 [B * KV_HEADS], zero between calls) by the last split to finish.
// FUSED_QK (0/1): q, k and v arrive raw (the qkv projection's output, before the per-head
//   RMSNorm and RoPE): every program normalises and rotates its group's query heads itself
//   (into shared memory), and the program whose split holds the step's new token normalises
//   and rotates its KV head's k and stores k and v into the caches at slots[b] (an e4m3 cache
//   as clamp(x * kv_inv_scale, -448, 448)), then reads that tile with coherent loads: what
//   livemeet.layers.fused.qk_norm_rope_store_kv did in a kernel of its own before this one,
//   in the same rounding order (every product rounded to bf16 where the torch reference
//   rounds it; the sum of squares is reduced in another order, an ulp apart at most).
// Compile-time switches: KV_FP8 (0/1), PAGE (tokens per KV block, a multiple of 16),
// NUM_STAGES (register pipeline depth, >= 2), EARLY_LOADS (0/1) and HEADS_INNER (0/1: the KV
// head is the grid's fastest index, so the programs of one (sequence, split) start side by
// side and read the same 1-KiB (FP8) or 2-KiB (bf16) token rows at about the same time; else
// the split is, and each token row's heads are read by programs launched far apart).
//
// Why this kernel exists: the Triton form pads the GQA group (2 query heads per KV head) to
// 16 tensor-core rows and stages every K/V tile through shared memory; for an FP8 cache the
// conversion and the staging bound it at ~40 us per layer at 36k tokens, the time of bf16,
// although it reads half the bytes (docs/benchmarks.md, sessions 3-5). Here each lane loads
// its own 16-byte pieces of K and V straight into registers in the layout the mma.sync
// operands need, converts them there and never touches shared memory until the final
// cross-warp merge.
//
// Layout (PTX ISA, "Matrix fragments for mma.m16n8k16"; lane = 4 g + t):
//   S = Q K^T per 16-key tile as two m16n8k16 products per 16 dims: A = Q (rows = query heads
//   of the group, row g real when g < group), B = K^T (8 keys, lane g holds key g). The dot
//   product is over the head dimension, so the order of dims inside a k16 step is free: lane t
//   takes 4 consecutive dims per step from its own 16-byte piece of the key row, for Q and K
//   alike, and no lane ever needs a neighbour's bytes.
//   O^T = V^T P^T: A = V^T (16 dims x 16 keys; lane (g, t) needs keys 2t, 2t+1, 2t+8, 2t+9 at
//   dims g and g+8 of each m-tile), B = P^T, whose fragment is exactly the S fragment of the
//   same lane (keys 2t, 2t+1 of each 8-key half, query g). V pieces of two keys are
//   interleaved with prmt into the key pairs the fragment wants. The head dims of each m-tile
//   are a fixed permutation of the real ones (dims_of below), undone when O is written.

typedef unsigned int u32;

#ifndef KV_FP8
#define KV_FP8 0
#endif
#ifndef PAGE
#define PAGE 16
#endif
#ifndef NUM_STAGES
#define NUM_STAGES 2   // tiles per warp in registers: 1 computed, NUM_STAGES - 1 in flight
#endif
#ifndef EARLY_LOADS
#define EARLY_LOADS 0  // load the first tiles before the PDL wait
#endif
#ifndef HEADS_INNER
#define HEADS_INNER 0  // grid (KV_HEADS, num_splits, B) instead of (num_splits, KV_HEADS, B)
#endif
#ifndef FUSED_QK
#define FUSED_QK 0  // q/k RMSNorm, RoPE and the K/V store in the prologue (see above)
#endif
#if FUSED_QK  // the prologue stores the new token's K/V through the cache pointers
#define KV_CONST
#define KV_RESTRICT
#else
#define KV_CONST const
#define KV_RESTRICT __restrict__
#endif

#define HEAD_DIM 128
#define TILE 16        // keys per warp iteration
#define NUM_WARPS 4
#define MAX_GROUP 8    // query heads per KV head: rows 0..7 of the m16 tile
#define PIECE 16       // bytes per load
#if KV_FP8
#define ELEM_BYTES 1
#else
#define ELEM_BYTES 2
#endif
#define ROW_BYTES (HEAD_DIM * ELEM_BYTES)          // one key's head, bytes
#define K_PIECES (ROW_BYTES / (4 * PIECE))         // pieces of a key row per lane (4 lanes)
#define V_PIECES (ROW_BYTES / (8 * PIECE))         // pieces of a value row per lane (8 lanes)
#define EPP (PIECE / ELEM_BYTES)                   // elements per piece
#define NEG_INF __int_as_float(0xff800000)

static_assert(PAGE % TILE == 0, "a tile must lie inside one KV block");
static_assert(NUM_STAGES >= 2, "one tile computed while the next loads");

struct Stage {
    uint4 k[2][K_PIECES];  // keys g and 8 + g of the tile
    uint4 v[4][V_PIECES];  // keys 2t, 2t + 1, 2t + 8, 2t + 9
};

// FRESH: a tile holding bytes this kernel stored (FUSED_QK's new token): a coherent load
// through L2, as the non-coherent path may not see a write made during the kernel
template <bool FRESH>
__device__ __forceinline__ uint4 load_piece(const unsigned char* p) {
    uint4 r;
    if (FRESH) {
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    } else {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    }
    return r;
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// Two e4m3 (low byte -> low half) to an f16x2.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 pair16) {
    u32 d;
    asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}"
        : "=r"(d)
        : "r"(pair16));
    return d;
}

// (lo, hi) fp32 to the mma's 16-bit pair: f16 for an FP8 cache, else bf16.
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 d;
#if KV_FP8
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
    return d;
}

__device__ __forceinline__ float bf16_lo(u32 x) { return __int_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(u32 x) { return __int_as_float(x & 0xffff0000u); }

#if KV_FP8
#define MMA_AB "f16.f16"  // operand types of the mma: fp16 (e4m3 converts to it in one step)
#else
#define MMA_AB "bf16.bf16"
#endif

__device__ __forceinline__ void mma16816(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB ".f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Physical head dims of O^T fragment rows (m-tile mt, row g) and (mt, row g + 8): the first is
// returned, the second is one past it (see the V piece layout in load_stage).
__device__ __forceinline__ int dims_of(int mt, int g) {
#if KV_FP8
    return g * 16 + 2 * mt;  // one 16-byte piece of 16 dims per lane
#else
    return (mt >> 2) * 64 + g * 8 + 2 * (mt & 3);  // two pieces of 8 dims, 64 dims apart
#endif
}

template <bool FRESH>
__device__ __forceinline__ void load_stage(Stage& s, const unsigned char* k_head,
                                           const unsigned char* v_head, long long tok_bytes,
                                           int valid, int g, int t) {
    // valid: keys of the tile that exist (1..16); the rest load zeros (stale cache bytes
    // may be NaN patterns, and 0 * NaN would poison the accumulators).
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        int key = n * 8 + g;
        const unsigned char* row = k_head + key * tok_bytes;
#pragma unroll
        for (int c = 0; c < K_PIECES; ++c) {
            s.k[n][c] = key < valid ? load_piece<FRESH>(row + c * 4 * PIECE + t * PIECE)
                                    : make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        int key = 2 * t + (kk & 1) + (kk >> 1) * 8;
        const unsigned char* row = v_head + key * tok_bytes;
#pragma unroll
        for (int c = 0; c < V_PIECES; ++c) {
            s.v[kk][c] = key < valid ? load_piece<FRESH>(row + c * 8 * PIECE + g * PIECE)
                                     : make_uint4(0, 0, 0, 0);
        }
    }
}

__device__ __forceinline__ u32 word(const uint4& x, int i) {
    return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

struct SoftmaxState {
    float m;  // running max of row g (log2 domain), identical on the row's 4 lanes
    float l;  // this lane's part of row g's sum of exp2(s - m)
    float acc[8][4];  // O^T fragments: m-tile mt, rows (dims) g / g + 8, cols (queries) 2t / 2t + 1
};

// One 16-key tile: scores, online softmax (Milakov & Gimelshein 2018), P V.
__device__ __forceinline__ void compute_tile(const Stage& s, const u32 (&qf)[K_PIECES][EPP / 2],
                                             int valid, float qk_scale, int g, int t,
                                             SoftmaxState& st) {
    float sc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
        for (int c = 0; c < K_PIECES; ++c) {
            u32 kr[EPP / 2];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                u32 x = word(s.k[n][c], w);
#if KV_FP8
                kr[2 * w] = e4m3x2_to_f16x2(x & 0xffffu);
                kr[2 * w + 1] = e4m3x2_to_f16x2(x >> 16);
#else
                kr[w] = x;
#endif
            }
#pragma unroll
            for (int u = 0; u < EPP / 4; ++u) {
                mma16816(sc[n], qf[c][2 * u], 0u, qf[c][2 * u + 1], 0u, kr[2 * u], kr[2 * u + 1]);
            }
        }
    }
    // row g, keys 2t, 2t + 1 (half 0) and 8 + 2t, 9 + 2t (half 1); rows g + 8 are padding
    float p[4] = {sc[0][0], sc[0][1], sc[1][0], sc[1][1]};
    int keys[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p[i] = keys[i] < valid ? p[i] * qk_scale : NEG_INF;
        mx = fmaxf(mx, p[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    float m_new = fmaxf(st.m, mx);
    float m_use = m_new == NEG_INF ? 0.f : m_new;  // never (-inf) - (-inf)
    float alpha = fast_exp2(st.m - m_use);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p[i] = fast_exp2(p[i] - m_use);
        sum += p[i];
    }
    st.l = st.l * alpha + sum;
    st.m = m_new;
    // the O^T columns of this lane are queries 2t and 2t + 1, whose rows live on lanes 8t, 8t + 4
    float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
    float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
    u32 pb0 = pack2(p[0], p[1]);
    u32 pb1 = pack2(p[2], p[3]);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        st.acc[mt][0] *= alpha0;
        st.acc[mt][2] *= alpha0;
        st.acc[mt][1] *= alpha1;
        st.acc[mt][3] *= alpha1;
        u32 a[4];  // (dim g, keys 2t..), (dim g + 8, keys 2t..), (dim g, keys 2t + 8..), (g + 8, ..)
#if KV_FP8
        // piece word mt / 2 holds dims 4 (mt / 2) .. + 3; bytes of keys A, B interleaved
        int w = mt >> 1;
        u32 sel = (mt & 1) ? 0x7362u : 0x5140u;
        u32 lo = prmt(word(s.v[0][0], w), word(s.v[1][0], w), sel);
        u32 hi = prmt(word(s.v[2][0], w), word(s.v[3][0], w), sel);
        a[0] = e4m3x2_to_f16x2(lo & 0xffffu);
        a[1] = e4m3x2_to_f16x2(lo >> 16);
        a[2] = e4m3x2_to_f16x2(hi & 0xffffu);
        a[3] = e4m3x2_to_f16x2(hi >> 16);
#else
        // piece mt / 4, word mt % 4 holds dims 2 (mt % 4), + 1 of the piece
        int c = mt >> 2, w = mt & 3;
        u32 x0 = word(s.v[0][c], w), x1 = word(s.v[1][c], w);
        u32 x2 = word(s.v[2][c], w), x3 = word(s.v[3][c], w);
        a[0] = prmt(x0, x1, 0x5410u);
        a[1] = prmt(x0, x1, 0x7632u);
        a[2] = prmt(x2, x3, 0x5410u);
        a[3] = prmt(x2, x3, 0x7632u);
#endif
        mma16816(st.acc[mt], a[0], a[1], a[2], a[3], pb0, pb1);
    }
}

// Q fragments: lane (g, t) holds query head g of the group at the dims of its K pieces;
// qrow: that head's 128 bf16 (global memory, or FUSED_QK's shared copy), read when g < group.
__device__ __forceinline__ void load_q(u32 (&qf)[K_PIECES][EPP / 2], const unsigned short* qrow,
                                       int group, int g, int t) {
#pragma unroll
    for (int c = 0; c < K_PIECES; ++c) {
        const int d0 = c * 4 * EPP + t * EPP;  // the piece's first dim
#pragma unroll
        for (int w = 0; w < EPP / 2; ++w) {
            u32 x = g < group ? *(const u32*)(qrow + d0 + 2 * w) : 0u;  // dims d0 + 2w, + 1
#if KV_FP8
            x = pack2(bf16_lo(x), bf16_hi(x));  // bf16 -> f16
#endif
            qf[c][w] = x;
        }
    }
}

#if FUSED_QK
__device__ __forceinline__ float round_bf16(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return __int_as_float(((u32)h) << 16);
}

// One head [128] by one warp, as livemeet.layers.fused._norm_rope_head: RMSNorm (statistics in
// fp32), rounded, times the weight, rounded; then rotate-half RoPE at `pos` with cos/sin of
// the fp32 angle rounded to bf16 and each product rounded. Lane l holds dims 2l, 2l + 1 of
// each half: v[0], v[1] and v[2], v[3] (= 64 + 2l, 65 + 2l), bf16-exact. src and w: 4-byte
// aligned bf16.
__device__ __forceinline__ void norm_rope_head(const unsigned short* src,
                                               const unsigned short* w, float pos,
                                               const float* inv_freq, float eps, int lane,
                                               float (&v)[4]) {
    const u32 lo = *(const u32*)(src + 2 * lane), hi = *(const u32*)(src + 64 + 2 * lane);
    const float a[4] = {bf16_lo(lo), bf16_hi(lo), bf16_lo(hi), bf16_hi(hi)};
    float ss = a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rstd = rsqrtf(ss / (float)HEAD_DIM + eps);
    const u32 wlo = *(const u32*)(w + 2 * lane), whi = *(const u32*)(w + 64 + 2 * lane);
    const float wv[4] = {bf16_lo(wlo), bf16_hi(wlo), bf16_lo(whi), bf16_hi(whi)};
    float n[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) n[i] = round_bf16(round_bf16(a[i] * rstd) * wv[i]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        // precise cosf/sinf (no fast math): angles reach ~1e5 rad
        const float angle = pos * inv_freq[2 * lane + j];
        const float c = round_bf16(cosf(angle)), sn = round_bf16(sinf(angle));
        // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
        v[j] = round_bf16(round_bf16(n[j] * c) - round_bf16(n[2 + j] * sn));
        v[2 + j] = round_bf16(round_bf16(n[2 + j] * c) + round_bf16(n[j] * sn));
    }
}

// A head's values (lane layout of norm_rope_head) into a cache row: bf16, or e4m3 as
// clamp(x * inv_scale, -448, 448) rounded to nearest (livemeet.layers.fused._store_head).
__device__ __forceinline__ void store_head(unsigned char* row, const float (&v)[4], int lane,
                                           float inv_scale) {
#if KV_FP8
    unsigned short lo, hi;
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = fminf(fmaxf(v[i] * inv_scale, -448.f), 448.f);
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x[1]), "f"(x[0]));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x[3]), "f"(x[2]));
    *(unsigned short*)(row + 2 * lane) = lo;
    *(unsigned short*)(row + 64 + 2 * lane) = hi;
#else
    // bf16-exact floats: their bits' high halves, dim 2l in the low half of the word
    *(u32*)(row + 4 * lane) = (__float_as_uint(v[0]) >> 16) | (__float_as_uint(v[1]) & 0xffff0000u);
    *(u32*)(row + 128 + 4 * lane) =
        (__float_as_uint(v[2]) >> 16) | (__float_as_uint(v[3]) & 0xffff0000u);
#endif
}
#endif  // FUSED_QK

__device__ __forceinline__ float load_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 load_cg4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

// The in-kernel merge (merge_splits) takes at most MERGE_SPLITS splits; each thread holds
// MERGE_ROWS of one head's partial rows in registers (64, within what the main loop uses, so
// the merge costs no occupancy).
#define MERGE_SPLITS 64
#define MERGE_ROWS (MERGE_SPLITS / NUM_WARPS)

// This thread's partial rows of one head (rows warp, warp + NUM_WARPS, ... < num_splits,
// float4 column lane), requested together.
__device__ __forceinline__ void load_head(float4 (&v)[MERGE_ROWS], const float* head_o,
                                          int num_splits, int warp, int lane) {
    const float* p = head_o + warp * HEAD_DIM + lane * 4;
#pragma unroll
    for (int j = 0; j < MERGE_ROWS; ++j) {
        if (warp + j * NUM_WARPS < num_splits) v[j] = load_cg4(p + j * NUM_WARPS * HEAD_DIM);
    }
}

// The group's outputs from num_splits partials (rows h * mid_splits + s of mid_o/mid_lse,
// h < group), weighted by exp2(lse - max lse); an empty split (lse -inf) weighs 0 and a head
// with no live split gives 0 (the Triton merge kernel's rule). scratch: NUM_WARPS x
// MAX_GROUP x HEAD_DIM floats of shared memory, 16-byte aligned (the warp merge's buffer,
// free by now); num_splits <= MERGE_SPLITS. This runs in the last program of a (sequence, KV
// head) once every other one has finished: it is the kernel's tail, so it waits for L2 once
// per head (a head's rows are requested together; the first head's with the lse values) and
// each warp reduces its heads' lse with shuffles. Its code stays short: straight-line code
// that runs once is bound by instruction fetch (an unrolled form with 5k instructions made
// the kernel ~5 us slower a layer; docs/benchmarks.md, session 39).
__device__ __forceinline__ void merge_splits(const float* mid_o, const float* mid_lse,
                                             unsigned short* out, long long out_stride_h,
                                             int group, int num_splits, int mid_splits,
                                             float v_scale, float* scratch) {
    __shared__ float w_s[MAX_GROUP][MERGE_SPLITS];
    __shared__ float inv_s[MAX_GROUP];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < group * num_splits; i += blockDim.x) {
        int r = i / num_splits, sp = i % num_splits;
        w_s[r][sp] = load_cg(mid_lse + r * mid_splits + sp);
    }
    float4 v[MERGE_ROWS];
    load_head(v, mid_o, num_splits, warp, lane);
    __syncthreads();
    for (int r = warp; r < group; r += NUM_WARPS) {  // head r's weights: 2 splits per lane
        const float a = lane < num_splits ? w_s[r][lane] : NEG_INF;
        const float c = lane + 32 < num_splits ? w_s[r][lane + 32] : NEG_INF;
        float mx = fmaxf(a, c);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float wa = (mx == NEG_INF || a == NEG_INF) ? 0.f : fast_exp2(a - mx);
        const float wc = (mx == NEG_INF || c == NEG_INF) ? 0.f : fast_exp2(c - mx);
        float sum = wa + wc;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();  // every lane has read head r's lse before it is overwritten
        if (lane < num_splits) w_s[r][lane] = wa;
        if (lane + 32 < num_splits) w_s[r][lane + 32] = wc;
        if (lane == 0) inv_s[r] = sum > 0.f ? 1.f / sum : 0.f;
    }
    __syncthreads();
#pragma unroll 1
    for (int r = 0; r < group; ++r) {
        if (r > 0) load_head(v, mid_o + (long long)r * mid_splits * HEAD_DIM, num_splits, warp, lane);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < MERGE_ROWS; ++j) {
            const int sp = warp + j * NUM_WARPS;
            if (sp < num_splits) {
                const float w = w_s[r][sp];
                acc.x += w * v[j].x;
                acc.y += w * v[j].y;
                acc.z += w * v[j].z;
                acc.w += w * v[j].w;
            }
        }
        *(float4*)(scratch + (warp * MAX_GROUP + r) * HEAD_DIM + lane * 4) = acc;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * HEAD_DIM; i += blockDim.x) {
        int r = i / HEAD_DIM, d = i % HEAD_DIM;
        float o = 0.f;
#pragma unroll
        for (int p = 0; p < NUM_WARPS; ++p) o += scratch[(p * MAX_GROUP + r) * HEAD_DIM + d];
        float x = o * inv_s[r] * v_scale;
        u32 bits;
        asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(bits) : "f"(x));
        out[r * out_stride_h + d] = (unsigned short)(bits & 0xffffu);
    }
}

// FUSED_QK's parameters (unused otherwise): k_new and v_new, the raw k and v of the step's
// token, [B, KV_HEADS, 128] bf16 at new_stride_b / new_stride_h elements; q_norm_w and k_norm_w
// bf16 [128]; positions int64 [B]; inv_freq fp32 [64]; slots int64 [B], the new token's cache
// slot (block * PAGE + offset, -1: none); eps; kv_inv_scale. q is then raw as well.
extern "C" __global__ void __launch_bounds__(NUM_WARPS * 32, 2)
livemeet_decode_split(const unsigned short* __restrict__ q, KV_CONST unsigned char* KV_RESTRICT k_cache,
                      KV_CONST unsigned char* KV_RESTRICT v_cache, const int* __restrict__ tables,
                      const int* __restrict__ seq_lens, float* __restrict__ mid_o,
                      float* __restrict__ mid_lse, unsigned short* __restrict__ out,
                      float qk_scale, float v_scale, long long q_stride_b, long long q_stride_h,
                      long long out_stride_b, long long out_stride_h, long long stride_blk,
                      long long stride_tok, long long stride_bt, int group, int mid_splits,
                      int* __restrict__ counters,
                      const unsigned short* __restrict__ k_new,
                      const unsigned short* __restrict__ v_new, long long new_stride_b,
                      long long new_stride_h, const unsigned short* __restrict__ q_norm_w,
                      const unsigned short* __restrict__ k_norm_w,
                      const long long* __restrict__ positions, const float* __restrict__ inv_freq,
                      const long long* __restrict__ slots, float eps, float kv_inv_scale) {
    // PDL (sm_90): let the next kernel be scheduled now; wait for the previous one's writes
    // (q, the KV of this step's token) below. No-ops when launched without the PDL attribute.
    // Before the wait this kernel reads only what no kernel of the step writes: seq_lens and
    // the block tables (copied in before the step's first kernel) and the KV of earlier tokens.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    __shared__ __align__(16) float o_s[NUM_WARPS][MAX_GROUP][HEAD_DIM];
    __shared__ float m_s[NUM_WARPS][MAX_GROUP];
    __shared__ float l_s[NUM_WARPS][MAX_GROUP];

#if HEADS_INNER
    const int split = blockIdx.y, kvh = blockIdx.x, num_splits = gridDim.y, num_kv_heads = gridDim.x;
#else
    const int split = blockIdx.x, kvh = blockIdx.y, num_splits = gridDim.x, num_kv_heads = gridDim.y;
#endif
    const int b = blockIdx.z, num_heads = num_kv_heads * group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;

    const int seq_len = seq_lens[b];
    const int per_split = (seq_len + num_splits - 1) / num_splits;
    const int split_len = (per_split + TILE - 1) / TILE * TILE;
    const int start = split * split_len;
    const int end = min(start + split_len, seq_len);
    const int num_tiles = end > start ? (end - start + TILE - 1) / TILE : 0;

    u32 qf[K_PIECES][EPP / 2];

    SoftmaxState st;
    st.m = NEG_INF;
    st.l = 0.f;
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) st.acc[mt][0] = st.acc[mt][1] = st.acc[mt][2] = st.acc[mt][3] = 0.f;

    const int* bt = tables + b * stride_bt;
    const long long tok_bytes = stride_tok * ELEM_BYTES;
    const long long head_off = (long long)kvh * HEAD_DIM * ELEM_BYTES;
    // tile i of this warp is the split's tile warp + i * NUM_WARPS
    auto tile_key = [&](int i) { return start + (warp + i * NUM_WARPS) * TILE; };
    auto tile_exists = [&](int i) { return warp + i * NUM_WARPS < num_tiles; };
    auto tile_block = [&](int i) { return tile_exists(i) ? bt[tile_key(i) / PAGE] : 0; };
    auto load = [&](Stage& s, int i, int blk) {
        if (!tile_exists(i)) return;
        int key0 = tile_key(i);
        long long base = (long long)blk * stride_blk * ELEM_BYTES + (key0 % PAGE) * tok_bytes + head_off;
        const int valid = min(TILE, end - key0);
        if (FUSED_QK && key0 + TILE >= seq_len) {  // holds the token this kernel stored
            load_stage<true>(s, k_cache + base, v_cache + base, tok_bytes, valid, g, t);
        } else {
            load_stage<false>(s, k_cache + base, v_cache + base, tok_bytes, valid, g, t);
        }
    };
    auto compute = [&](const Stage& s, int i) {
        if (!tile_exists(i)) return;
        compute_tile(s, qf, min(TILE, end - tile_key(i)), qk_scale, g, t, st);
    };

    // NUM_STAGES tiles in registers: tiles i + 1 .. i + NUM_STAGES - 1 are in flight while
    // tile i is computed (a ring indexed by compile-time constants, so it stays in registers).
    // The block id of the next tile to load is read one step ahead, so a table read never
    // holds up a KV load.
    Stage ring[NUM_STAGES];
#pragma unroll
    for (int j = 0; j < NUM_STAGES - 1; ++j) {
        // EARLY_LOADS: a prologue tile that ends before the step's new token (the only KV the
        // kernels before this one write) is loaded before the PDL wait
        if (!EARLY_LOADS || tile_key(j) + TILE >= seq_len) continue;
        load(ring[j], j, tile_block(j));
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if FUSED_QK
    // the group's query heads, normalised and rotated, for load_q; the program whose split
    // holds the new token stores its KV head's k and v (module header)
    __shared__ __align__(16) unsigned short q_s[MAX_GROUP][HEAD_DIM];
    {
        const float pos = (float)positions[b];
        for (int r = warp; r < group; r += NUM_WARPS) {
            float v[4];
            norm_rope_head(q + b * q_stride_b + (kvh * group + r) * q_stride_h, q_norm_w, pos,
                           inv_freq, eps, lane, v);
            *(u32*)&q_s[r][2 * lane] = (__float_as_uint(v[0]) >> 16) | (__float_as_uint(v[1]) & 0xffff0000u);
            *(u32*)&q_s[r][64 + 2 * lane] = (__float_as_uint(v[2]) >> 16) | (__float_as_uint(v[3]) & 0xffff0000u);
        }
        const long long slot = seq_len > 0 && start < seq_len && seq_len <= end ? slots[b] : -1;
        if (slot >= 0 && warp >= NUM_WARPS - 2) {  // the last two warps: k, then v
            const long long row_bytes = ((slot / PAGE) * stride_blk + (slot % PAGE) * stride_tok) * ELEM_BYTES + head_off;
            const unsigned short* src = (warp == NUM_WARPS - 2 ? k_new : v_new) + b * new_stride_b + kvh * new_stride_h;
            float v[4];
            if (warp == NUM_WARPS - 2) {
                norm_rope_head(src, k_norm_w, pos, inv_freq, eps, lane, v);
            } else {
                const u32 lo = *(const u32*)(src + 2 * lane), hi = *(const u32*)(src + 64 + 2 * lane);
                v[0] = bf16_lo(lo), v[1] = bf16_hi(lo), v[2] = bf16_lo(hi), v[3] = bf16_hi(hi);
            }
            store_head((warp == NUM_WARPS - 2 ? k_cache : v_cache) + row_bytes, v, lane, kv_inv_scale);
        }
        __syncthreads();  // q_s written; the stores visible to this program's loads
    }
#endif
#pragma unroll
    for (int j = 0; j < NUM_STAGES - 1; ++j) {
        if (EARLY_LOADS && tile_key(j) + TILE < seq_len) continue;
        load(ring[j], j, tile_block(j));
    }
#if FUSED_QK
    load_q(qf, &q_s[g < group ? g : 0][0], group, g, t);
#else
    load_q(qf, q + b * q_stride_b + (kvh * group + (g < group ? g : 0)) * q_stride_h, group, g, t);
#endif
    int blk_next = tile_block(NUM_STAGES - 1);
    for (int i = 0; tile_exists(i); i += NUM_STAGES) {
#pragma unroll
        for (int j = 0; j < NUM_STAGES; ++j) {
            const int ahead = i + j + NUM_STAGES - 1;
            const int blk_after = tile_block(ahead + 1);
            load(ring[(j + NUM_STAGES - 1) % NUM_STAGES], ahead, blk_next);
            compute(ring[j], i + j);
            blk_next = blk_after;
        }
    }

    // merge the warps: each warp's (m, l, unnormalised O) per query row
    st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
    st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
    if (t == 0 && g < group) {
        m_s[warp][g] = st.m;
        l_s[warp][g] = st.l;
    }
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        int d = dims_of(mt, g);
        if (2 * t < group) {
            o_s[warp][2 * t][d] = st.acc[mt][0];
            o_s[warp][2 * t][d + 1] = st.acc[mt][2];
        }
        if (2 * t + 1 < group) {
            o_s[warp][2 * t + 1][d] = st.acc[mt][1];
            o_s[warp][2 * t + 1][d + 1] = st.acc[mt][3];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * HEAD_DIM; idx += NUM_WARPS * 32) {
        int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < NUM_WARPS; ++w) m = fmaxf(m, m_s[w][r]);
        float l = 0.f, o = 0.f;
        if (m != NEG_INF) {
#pragma unroll
            for (int w = 0; w < NUM_WARPS; ++w) {
                float scale = m_s[w][r] == NEG_INF ? 0.f : fast_exp2(m_s[w][r] - m);
                l += l_s[w][r] * scale;
                o += o_s[w][r][d] * scale;
            }
        }
        float res = l > 0.f ? o / l : 0.f;
        int h = kvh * group + r;
        if (num_splits == 1) {
            float v = res * v_scale;
            u32 bits;
            asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(bits) : "f"(v));
            out[b * out_stride_b + h * out_stride_h + d] = (unsigned short)(bits & 0xffffu);
        } else {
            long long row = ((long long)b * num_heads + h) * mid_splits + split;
            mid_o[row * HEAD_DIM + d] = res;
            if (d == 0) mid_lse[row] = l > 0.f ? m + __log2f(l) : NEG_INF;
        }
    }
    if (counters == nullptr || num_splits == 1) return;
    // split-K semaphore (livemeet/layers/split_k.py): the last split of (b, kvh) to finish
    // merges every split's partial; the barrier orders this CTA's partial stores before the
    // release, and partials are read through L2 (ld.cg), as L1 is not coherent across SMs
    __shared__ int is_last;
    __syncthreads();
    int* counter = counters + b * num_kv_heads + kvh;
    if (threadIdx.x == 0) {
        int done;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(done) : "l"(counter) : "memory");
        is_last = done == num_splits - 1;
    }
    __syncthreads();
    if (!is_last) return;
    const long long row0 = ((long long)b * num_heads + kvh * group) * mid_splits;
    merge_splits(mid_o + row0 * HEAD_DIM, mid_lse + row0, out + b * out_stride_b + kvh * group * out_stride_h,
                 out_stride_h, group, num_splits, mid_splits, v_scale, &o_s[0][0][0]);
    if (threadIdx.x == 0) asm volatile("st.relaxed.gpu.global.s32 [%0], 0;" ::"l"(counter) : "memory");
}
