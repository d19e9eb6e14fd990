// MLA attention on sm_90 (H100/H200) with warpgroup MMAs: BM = 64 packed (token, head) query rows
// against a range of latent KV rows, producing a partial state (fp32 o, normalized, and lse).
//
// Why this shape (the H200's budget: 227 KB of shared memory, 64K registers, wgmma):
// - mma.sync reads every K/V fragment through the load/store unit once per 16-row block, and the
//   sm_120 loop (attention.cuh) is bound by that shared-memory traffic on the H200. wgmma feeds the
//   tensor cores straight from shared memory and keeps 64 rows per instruction, so each staged
//   byte is read once per CTA.
// - Three warpgroups: a producer stages KV tiles with cp.async into a STAGES-deep ring, already in
//   the 128-byte-swizzled layout wgmma reads (9 column blocks of 64 dims, BN rows each); two
//   consumers split the work by dims, 18 k-steps of 16 dims each (bf16 and per-tensor rows: k-steps
//   2j + c, interleaved; DSA rows: its latent dims [c*DV/2, (c+1)*DV/2) and half of the rope): the
//   first Q_REG_STEPS from registers (A operand), the rest from a swizzled copy of those Q dims in
//   shared memory. Consumer c holds O's value dims [c*DV/2, (c+1)*DV/2) as its accumulator.
// - Per tile each consumer computes a partial score S_c = Q_c K_c^T (m64n32 wgmmas), the two
//   exchange partials through shared memory (double-buffered by tile parity; DSA rows: one buffer,
//   consumer 0 adds and hands back the sums), both run the same online softmax on S_0 + S_1 (so
//   they agree on max and sum without talking), and each adds
//   P V_c (m64n256 wgmmas, P from registers, V N-major: the same staged rows).
// - Software pipelining (wg_consume): tile j's QK is issued, then tile j-1's P·V, which runs on the
//   tensor cores during tile j's exchange and softmax.
// - Registers: the producer gives its registers to the consumers (setmaxnreg, 240 each; over fp8
//   rows 232, and 40 for the producer's conversion, 4 chunks in flight: bench/NOTES.md v22b): Q
//   (4 per register k-step), O (128), scores (16) and P (8); with all of Q in registers ptxas
//   serializes the wgmmas. Q's smem part costs 2 KB of shared-memory reads per k-step and tile.
//   DSA rows hold a second score accumulator and a second P instead of Q (all of it in smem); 3
//   ring stages fit beside it because their raw stages hold only the latent (the producer copies
//   the rope and scales straight into the ring stage) and the score exchange has one buffer.
// - fp8 rows (KV_FP8): the consumers run on a bf16 ring. The producer copies each tile's raw rows
//   into one of two raw stages (cp.async, a tile ahead) and converts the e4m3 bytes into the ring,
//   exactly (e4m3 is a subset of bf16). One kv_scale (per-tensor rows) multiplies the scores and O.
// - The DSA pool's rows (KV_SCALED: e4m3 latent | 4 fp32 block scales | bf16 rope): the ring holds
//   the latent bytes unscaled, exactly as above, and the rope as it is; the producer puts each row's
//   block scales beside the stage. A consumer's latent dims are exactly two scale blocks, so the
//   scales cost fp32 multiplies and no rounding: Q·K accumulates each block's <q, k> in its own
//   accumulator, scaled and added to the rope's in fp32 (as mma.sync's loop does); P·V takes P
//   times each block's scale, rounded once to bf16 as P alone would be, as the A operand of an
//   m64n128 wgmma per block. (A bf16 ring of e4m3 x scale rounded to 8 bits misses the f16 mode's
//   lse tolerance: bench/NOTES.md v17; this design: v20.)
#pragma once
#include "kgen/wgmma_ring.cuh"

namespace kgen {

// Layout: the CTA's shared memory (bytes from a 1024-aligned base), rendered by
// kgen/designs/wgmma.py (the planner's budget): the ring of STAGES tiles of STAGE_BYTES (D/64
// swizzled column blocks of SLAB bytes), Q's shared-memory column blocks at Q_SMEM_OFF (Q_SLABS of
// Q_SLAB bytes: each consumer's latent dims past its Q_REG_STEPS register k-steps, then the rope),
// the partial-score exchange at X_OFF ([tile parity][consumer][BM * BN] fp32; DSA rows: [BM * BN]),
// the barriers at BAR_OFF, for fp8 rows the two raw stages (RAW_OFF, RAW_STAGE_BYTES each) and, for
// the DSA pool's rows, each ring stage's block scales (SCALE_OFF, [stage][BN][block] fp32), ALIGN_SLACK to align
// the base up, SMEM_BYTES in all, and SCRATCH_OFF: the schedule's scratch (free until the first tile).
template <int HEADS_, int D_, int DV_, int BN_, int STAGES_, bool KV_FP8_, bool KV_SCALED_, class Layout>
struct WgmmaAttnConfig : WgRing<HEADS_, D_, DV_, BN_, STAGES_, KV_FP8_, KV_SCALED_, Layout> {
    using Ring = WgRing<HEADS_, D_, DV_, BN_, STAGES_, KV_FP8_, KV_SCALED_, Layout>;
    using Ring::D, Ring::DV, Ring::BN, Ring::KV_FP8, Ring::KV_SCALED, Ring::WG_DV;
    using typename Ring::Row;
    using Layout::Q_REG_STEPS, Layout::Q_SLABS, Layout::SLAB, Layout::STAGE_BYTES;
    static constexpr int ROPE_HALF = (D - DV) / 2;       // rope dims per consumer
    static constexpr int LATENT_STEPS = WG_DV / 16;      // a consumer's latent k16 steps, then its rope steps
    static constexpr int WG_K_STEPS = LATENT_STEPS + ROPE_HALF / 16;
    static constexpr int Q_LATENT_SLABS = (WG_DV - 16 * Q_REG_STEPS) / 64;  // a consumer's latent Q column blocks in smem
    static constexpr int EXCHANGE_BAR = 1;  // named barrier of the 256 consumer threads
    static constexpr int PARTIAL_BAR = 2, SUM_BAR = 3;  // consumer 1's partial scores are in; consumer 0's sums are

    static_assert(D - DV == 64 && WG_DV == 256, "the loop is written for 64 rope dims (32 a consumer) and m64n256 P·V");
    static_assert(BN == 32, "QK uses m64n32k16 wgmmas");
    static_assert(Q_REG_STEPS % 4 == 0 && Q_REG_STEPS <= LATENT_STEPS && Q_SLABS == 2 * Q_LATENT_SLABS + (D - DV) / 64,
                  "Q's smem part is whole column blocks after the register k-steps");
    static_assert(!KV_SCALED || Row::SCALE_BLOCK * 2 == WG_DV, "a consumer's latent dims are two scale blocks");
};

// A tile's scores in one consumer: s[4i + 2h + e] is row g + 8h, key 8i + 2t + e. DSA rows: s and
// blk take the consumer's two scale blocks (unscaled) until fold_blocks scales and adds them into
// s, and the rope's k-steps then accumulate onto s.
template <class C>
struct WgScores {
    float s[16];
    float blk[C::KV_SCALED ? 16 : 1];
};

// The first dim of consumer c's k-step ks. DSA rows: the consumer's latent dims (two whole scale
// blocks, so two score accumulators), then its half of the rope. Otherwise k-steps interleave
// (2ks + c), so each consumer's k-steps are one region a constant apart from the other's (fewer
// descriptors: the bf16 loop is at its register limit).
template <class C>
__device__ __forceinline__ constexpr int step_dim(int c, int ks) {
    if (!C::KV_SCALED) return (2 * ks + c) * 16;
    return ks < C::LATENT_STEPS ? c * C::WG_DV + 16 * ks : C::DV + c * C::ROPE_HALF + 16 * (ks - C::LATENT_STEPS);
}

// Q's smem column block of consumer c's dim `dim` (past its register k-steps), and the first dim of
// smem column block `slab`. DSA rows: each consumer's latent blocks, then the rope's; otherwise the
// dims from the consumers' last register k-step on, in order.
template <class C>
__device__ __forceinline__ constexpr int q_slab_of(int c, int dim) {
    if (!C::KV_SCALED) return (dim - 32 * C::Q_REG_STEPS) / 64;
    return dim < C::DV ? c * C::Q_LATENT_SLABS + (dim - c * C::WG_DV - 16 * C::Q_REG_STEPS) / 64
                       : 2 * C::Q_LATENT_SLABS + (dim - C::DV) / 64;
}
template <class C>
__device__ __forceinline__ constexpr int q_slab_dim0(int slab) {
    if (!C::KV_SCALED) return 32 * C::Q_REG_STEPS + 64 * slab;
    return slab < 2 * C::Q_LATENT_SLABS
               ? (slab / C::Q_LATENT_SLABS) * C::WG_DV + 16 * C::Q_REG_STEPS + (slab % C::Q_LATENT_SLABS) * 64
               : C::DV + (slab - 2 * C::Q_LATENT_SLABS) * 64;
}

// Stage descriptors of a consumer (its first k-step's place at stage 0): K (K-major; 8-row groups
// 1024 B apart, no leading offset inside a swizzled block), Q's smem part likewise (at its first
// smem k-step, as if the register k-steps were there too), V for its value dims (N-major: 64-dim
// blocks SLAB apart, 8-key groups 1024 B apart); DSA rows: K and Q at its rope dims too. Stage s is
// STAGE_BYTES further.
struct WgDescs {
    unsigned long long k, q, v, k_rope, q_rope;
    template <class C>
    __device__ __forceinline__ static WgDescs of(char* smem, int c) {
        char* q = smem + C::Q_SMEM_OFF;
        auto q_at = [&](int dim) { return sw128_desc(q + q_slab_of<C>(c, dim) * C::Q_SLAB + dim % 64 * 2, 16, 1024); };
        WgDescs d{sw128_desc(smem + dim_offset(step_dim<C>(c, 0), C::SLAB), 16, 1024), q_at(step_dim<C>(c, C::Q_REG_STEPS)),
                  sw128_desc(smem + dim_offset(c * C::WG_DV, C::SLAB), C::SLAB, 1024), 0, 0};
        if constexpr (C::KV_SCALED) {
            const int rope = step_dim<C>(c, C::LATENT_STEPS);
            d.k_rope = sw128_desc(smem + dim_offset(rope, C::SLAB), 16, 1024);
            d.q_rope = q_at(rope);
        }
        return d;
    }
};

// One k-step of a consumer's partial scores into acc: Q from registers or from shared memory; k
// and q are the descriptors of the k-step's region (the latent, or a DSA row's rope) at the tile's
// stage. Offsets from them are compile-time (ks is unrolled; consumer 0's dims give them).
template <class C>
__device__ __forceinline__ void qk_step(float (&acc)[16], const WgConsumer<C>& st, unsigned long long k,
                                        unsigned long long q, int ks, bool accumulate) {
    const int first = C::KV_SCALED && ks >= C::LATENT_STEPS ? C::LATENT_STEPS : 0;  // the region's first k-step
    const unsigned long long kd = desc_add(k, dim_offset(step_dim<C>(0, ks) - step_dim<C>(0, first), C::SLAB));
    if (ks < C::Q_REG_STEPS) {
        wgmma_m64n32k16(acc, st.qf[ks < C::Q_REG_STEPS ? ks : 0], kd, accumulate);
    } else {
        const int q_rel = step_dim<C>(0, ks) - step_dim<C>(0, first > 0 ? first : C::Q_REG_STEPS);
        wgmma_m64n32k16_ss(acc, desc_add(q, dim_offset(q_rel, C::Q_SLAB)), kd, accumulate);
    }
}

// Wait for ring position `pos`, then issue (and commit) this consumer's partial scores of it over
// its k-steps; DSA rows: its two scale blocks' only, into s and blk (then fold_blocks).
template <class C>
__device__ __forceinline__ void wg_issue_qk(char* smem, const WgConsumer<C>& st, const WgDescs& d, int pos,
                                            WgScores<C>& sc) {
    const int stage = ring_wait_full<C>(smem, pos);
    fence_async_shared();
    const unsigned long long k = desc_add(d.k, stage * C::STAGE_BYTES);
    wgmma_fence();
    if constexpr (C::KV_SCALED) {
#pragma unroll
        for (int ks = 0; ks < C::BLOCK_STEPS; ++ks) qk_step<C>(sc.s, st, k, d.q, ks, ks != 0);
#pragma unroll
        for (int ks = C::BLOCK_STEPS; ks < C::LATENT_STEPS; ++ks) qk_step<C>(sc.blk, st, k, d.q, ks, ks != C::BLOCK_STEPS);
    } else {
#pragma unroll
        for (int ks = 0; ks < C::WG_K_STEPS; ++ks) qk_step<C>(sc.s, st, k, d.q, ks, ks != 0);
    }
    wgmma_commit();
}

// DSA rows: consumer c's scale blocks are 2c and 2c + 1: (scale_2c, scale_2c+1) of key `key`.
template <class C>
__device__ __forceinline__ float2 key_scales(const float* scales, int c, int key) {
    return *reinterpret_cast<const float2*>(scales + key * (C::DV / C::Row::SCALE_BLOCK) + 2 * c);
}

// DSA rows, once the blocks' scores are in (nothing in flight): s = scale_0(key) * s +
// scale_1(key) * blk in fp32, then issue (and commit) the rope's k-steps onto s. Folding first
// keeps two accumulators live, not three (the consumers are at their register limit).
template <class C>
__device__ __forceinline__ void fold_blocks(char* smem, const WgConsumer<C>& st, const WgDescs& d, int pos,
                                            WgScores<C>& sc) {
    const WgCoords w = WgCoords::of();
    const int stage = pos % C::STAGES;
    const float* scales = stage_scales<C>(smem, stage);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 k0 = key_scales<C>(scales, w.c, 8 * i + 2 * w.t), k1 = key_scales<C>(scales, w.c, 8 * i + 2 * w.t + 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float* s = sc.s + 4 * i + 2 * h;
            const float* b = sc.blk + 4 * i + 2 * h;
            s[0] = fmaf(k0.y, b[0], k0.x * s[0]);
            s[1] = fmaf(k1.y, b[1], k1.x * s[1]);
        }
    }
    wgmma_fence();  // s is written by the rope's wgmmas now
    const unsigned long long k = desc_add(d.k_rope, stage * C::STAGE_BYTES);
#pragma unroll
    for (int ks = C::LATENT_STEPS; ks < C::WG_K_STEPS; ++ks) qk_step<C>(sc.s, st, k, d.q_rope, ks, true);
    wgmma_commit();
}

// The scores of ring position `pos` (key tile `tile`): exchange the partials with the other
// consumer (same thread, same positions in both) and add them — a + b is order independent (DSA
// rows: consumer 0 adds, both take its sums), so both consumers hold bit-identical scores — then
// the online softmax (base 2) of rows g (h = 0) and g + 8 (h = 1): s[4i + 2h + e] (key 8i + 2t + e)
// becomes its probability, alpha[h] the factor the row's O and sum are rescaled by.
template <class C, class Visible>
__device__ __forceinline__ void wg_softmax(char* smem, WgConsumer<C>& st, int pos, int tile, WgScores<C>& sc,
                                           float (&alpha)[2], int num_keys, const Visible& visible, float scale_log2) {
    const WgCoords w = WgCoords::of();
    float (&s)[16] = sc.s;
    if constexpr (C::KV_SCALED) {
        // One buffer of BM * BN floats (shared memory is short), a thread its own 16 slots:
        // consumer 1 leaves its partial scores, consumer 0 adds them to its own and leaves the sums,
        // which consumer 1 reads.
        float4* x = reinterpret_cast<float4*>(smem + C::X_OFF) + threadIdx.x % 128;
        if (w.c == 1) {
#pragma unroll
            for (int i = 0; i < 4; ++i) x[i * 128] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
            named_arrive(C::PARTIAL_BAR, 256);
            named_barrier(C::SUM_BAR, 256);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float4 v = x[i * 128];
                s[4 * i] = v.x; s[4 * i + 1] = v.y; s[4 * i + 2] = v.z; s[4 * i + 3] = v.w;
            }
        } else {
            named_barrier(C::PARTIAL_BAR, 256);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float4 v = x[i * 128];
                s[4 * i] += v.x; s[4 * i + 1] += v.y; s[4 * i + 2] += v.z; s[4 * i + 3] += v.w;
                x[i * 128] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
            }
            named_arrive(C::SUM_BAR, 256);
        }
    } else {
        // [tile parity][consumer][BM * BN]: each consumer writes its partial and adds the other's.
        float* exchange = reinterpret_cast<float*>(smem + C::X_OFF);
        float* mine = exchange + ((pos & 1) * 2 + w.c) * C::BM * C::BN;
        const float* theirs = exchange + ((pos & 1) * 2 + 1 - w.c) * C::BM * C::BN;
        const int wg_thread = threadIdx.x % 128;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            *reinterpret_cast<float4*>(mine + (i * 128 + wg_thread) * 4) = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
        named_barrier(C::EXCHANGE_BAR, 256);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float4 v = *reinterpret_cast<const float4*>(theirs + (i * 128 + wg_thread) * 4);
            s[4 * i] += v.x; s[4 * i + 1] += v.y; s[4 * i + 2] += v.z; s[4 * i + 3] += v.w;
        }
    }
    wg_mask<C>(s, tile, num_keys, visible);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const SoftmaxStep step = online_softmax_step<C::MAX_SLACK>(st.row_max[h], wg_row_max(s, h) * scale_log2);
        alpha[h] = step.alpha;
        st.row_sum[h] = st.row_sum[h] * alpha[h] + wg_exp_row(s, h, scale_log2, step.ref);
    }
}

// Rescale O by the tile's alpha (skipped once the maxima settle: alpha is exactly 1) and pack the
// probabilities as P·V's A operand: k-step kk is score columns 16kk .. 16kk + 15 (DSA rows: times
// each key's block scale, in fp32, then rounded once). No P·V may be in flight (it reads pf and
// writes O).
template <class C>
__device__ __forceinline__ void wg_rescale_and_pack(char* smem, WgConsumer<C>& st, int pos, const float (&s)[16],
                                                    const float (&alpha)[2], WgP<C>& pf) {
    wg_rescale_o<C>(st, alpha);
    // DSA rows: the keys' scales again from shared memory, as fold_blocks read them (registers are short)
    wg_pack_p<C>(s, {1.f, 1.f}, ring_scales<C>(smem, pos), 2 * WgCoords::of().c, pf);
}

// Attend over the staged tiles of a range, continuing the online softmax in `st`. Software
// pipelined: tile j's scores are issued first, then tile j-1's P·V, whose tensor-core work runs
// under tile j's exchange and softmax. The first tile is peeled so every wgmma in the loop is
// issued unconditionally (a wgmma under a runtime branch makes the compiler merge accumulator
// registers with moves, and ptxas then serializes all wgmmas).
// DSA rows wait for tile j's block scores before folding them, which waits for whatever was issued
// before: so tile j-1's P·V is issued first, before tile j's stage is waited for, and its stage is
// released as soon as tile j's block scores are in (the producer gets it a softmax earlier); P·V
// runs under the producer's wait and tile j's Q·K, not its softmax.
template <class C, class Visible>
__device__ __forceinline__ void wg_consume(char* smem, WgConsumer<C>& st, int& ring_pos, int num_keys,
                                           const Visible& visible, int tile_begin, int tile_end, float scale_log2) {
    if (tile_begin >= tile_end) return;
    const WgDescs d = WgDescs::of<C>(smem, WgCoords::of().c);
    const int pos0 = ring_pos - tile_begin;  // ring position of tile t: pos0 + t
    WgP<C> pf;
    auto scores = [&](int tile, WgScores<C>& sc, float (&alpha)[2]) {  // issued Q·K to probabilities
        const int pos = pos0 + tile;
        if constexpr (C::KV_SCALED) {
            wgmma_wait<0>();
            if (tile > tile_begin) wg_release(ring_empty<C>(smem, (pos - 1) % C::STAGES));
            fold_blocks<C>(smem, st, d, pos, sc);
            wgmma_wait<0>();
        }
        wg_softmax<C>(smem, st, pos, tile, sc, alpha, num_keys, visible, scale_log2);
    };
    {
        WgScores<C> sc;
        float alpha[2];
        wg_issue_qk<C>(smem, st, d, pos0 + tile_begin, sc);
        if constexpr (!C::KV_SCALED) wgmma_wait<0>();
        scores(tile_begin, sc, alpha);
        wg_rescale_and_pack<C>(smem, st, pos0 + tile_begin, sc.s, alpha, pf);
    }
    for (int tile = tile_begin + 1; tile < tile_end; ++tile) {
        const int pos = pos0 + tile;
        WgScores<C> sc;
        float alpha[2];
        if constexpr (C::KV_SCALED) {
            wg_issue_pv<C>(st, d.v, pos - 1, pf);
            wg_issue_qk<C>(smem, st, d, pos, sc);
            scores(tile, sc, alpha);
        } else {
            wg_issue_qk<C>(smem, st, d, pos, sc);
            wg_issue_pv<C>(st, d.v, pos - 1, pf);
            wgmma_wait<1>();  // QK of this tile is done; P·V of the last one may run on
            scores(tile, sc, alpha);
            wgmma_wait<0>();
            wg_release(ring_empty<C>(smem, (pos - 1) % C::STAGES));
        }
        wg_rescale_and_pack<C>(smem, st, pos, sc.s, alpha, pf);
    }
    wg_issue_pv<C>(st, d.v, pos0 + tile_end - 1, pf);
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, (pos0 + tile_end - 1) % C::STAGES));
    ring_pos = pos0 + tile_end;
}

// Normalize and write this consumer's half of part_o[BM][DV]; consumer 0 writes part_lse[BM]
// (natural log; -inf for rows that saw nothing).
template <class C>
__device__ __forceinline__ void wg_end(const WgConsumer<C>& st, float* __restrict__ part_o, float* __restrict__ part_lse,
                                       float out_scale) {
    wg_store_state<C>(st, WgCoords::of().c, [](int, float sum) { return sum; }, out_scale, part_o, part_lse);
}

// Attention of the CTA's BM query rows over the key range `first`, then the range second() returns
// (NoKeys: none; made once the first is done), one online softmax; writes the partial state to
// part_o / part_lse. Every thread calls it.
// A per-tensor fp8 cache's kv_scale multiplies the scores (folded into scale_log2) and O (in wg_end).
template <class C, class QRows, class First, class SecondFn>
__device__ __forceinline__ void attend(char* smem_raw, const QRows& q_rows, int num_rows, float scale_log2,
                                       float kv_scale, const First& first, const SecondFn& second_fn,
                                       float* __restrict__ part_o, float* __restrict__ part_lse) {
    constexpr bool PER_TENSOR = C::KV_FP8 && !C::KV_SCALED;
    // a stage is full after every producer thread's conversion (DSA rows: and its cp.async arrival)
    char* smem = wg_setup<C>(smem_raw, C::KV_SCALED ? 2 * 128 : 128);
    if (threadIdx.x < 128) {
        wg_producer<C>(smem, first, second_fn);
    } else {
        setmaxnreg_inc<C::CONSUMER_REGS>();
        if constexpr (PER_TENSOR) scale_log2 *= kv_scale;
        int ring_pos = 0;
        WgConsumer<C> st;
        wg_begin<C>(smem, st, q_rows, num_rows, [](int c, int ks) { return step_dim<C>(c, ks); },
                    [](int slab) { return q_slab_dim0<C>(slab); });
        wg_consume<C>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);
        const auto second = second_fn();
        if constexpr (is_key_range<decltype(second_fn())>)
            wg_consume<C>(smem, st, ring_pos, second.num_keys, second.visible, second.tile_begin, second.tile_end,
                          scale_log2);
        wg_end<C>(st, part_o, part_lse, PER_TENSOR ? kv_scale : 1.f);
    }
}

}  // namespace kgen
