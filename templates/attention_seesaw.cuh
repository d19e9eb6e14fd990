// MLA attention on sm_90 (H100/H200) with warpgroup MMAs and "seesaw" consumers: BM = 64 packed
// (token, head) query rows against a range of KV rows (bf16, e4m3 with one kv_scale, or the DSA
// pool's rows), producing the partial state (fp32 o, normalized, and lse) every loop design produces.
//
// Why a second sm_90 loop (bench/NOTES.md v23): the wgmma loop's consumers split Q·K's dims, so
// every tile they swap partial scores through shared memory and run the same softmax in lockstep,
// and the tensor cores wait for that chain each tile. Here each consumer scores every other tile
// whole, as FlashMLA's dense decode does: consumer 0 takes tiles 2p, consumer 1 tiles 2p + 1, each
// over all D dims, while O stays split by value dims (consumer c holds dims [c DV/2, (c+1) DV/2)).
// Each consumer hands its tile's probabilities to the other through shared memory (bf16, BM x BN),
// so each adds both tiles of a pair to its half of O. The pair's softmax runs in turn — consumer 1
// starts from consumer 0's max — so both keep one running max m per row (base 2, scaled scores):
//   c0: m0 = max(m, max S_a), alpha = 2^(m - m0), P_a = 2^(S_a - m0)     O_lo = alpha O_lo + P_a V_a
//   c1: m1 = max(m0, max S_b), beta = 2^(m0 - m1), P_b = 2^(S_b - m1)
//       O_hi = alpha beta O_hi + P_b V_b + (beta P_a) V_a                 (P_a from c0, times beta)
//   c0: O_lo = beta O_lo + P_b V_b                                         (P_b from c1)
// and each consumer's softmax runs under the other's MMAs. A range with an odd tile count ends
// with consumer 0's tile alone. The row sums stay split (each consumer sums its own tiles') until
// the end.
// - The producer warpgroup, the ring (BN = 32 keys a stage, 4 stages: a stage is refilled a whole
//   pair before it is read again) and the consumers' state are the wgmma loop's (wgmma_ring.cuh).
//   fp8 rows (per-tensor): the producer converts each tile's e4m3 bytes into the bf16 ring, exactly,
//   from two raw stages (RAW_OFF), as in the wgmma loop; 3 stages fit beside them; kv_scale
//   multiplies the scores and O.
// - The DSA pool's rows (KV_SCALED: e4m3 latent | 4 fp32 block scales | bf16 rope): the ring holds
//   the latent unscaled (exact) and the rope, the stage's block scales at SCALE_OFF, as in the wgmma
//   loop. A tile's owner scores the rope into s and each scale block into one of two alternating
//   accumulators, folding block b in as scale_b(key) x its partial while the next block's wgmmas
//   run; P·V takes P times each value block's scale (rounded once to bf16), so each probability tile
//   a consumer shares holds the other's two value blocks' P, one in each half of its 128-byte rows.
// - Q: k-steps 0 .. Q_SMEM_STEPS - 1 from a swizzled copy in shared memory (both consumers read it),
//   the last Q_REG_STEPS from each thread's registers: the rope, and over bf16 and per-tensor rows the
//   latent's last 64 dims too (an eighth fewer shared-memory bytes a Q·K: bench/NOTES.md v64).
// - Shared memory beyond the ring and Q: the two consumers' probability tiles (P_OFF: [c][BM rows of
//   128 B], BN keys a row, the layout of an A operand) and per-row values at ROW_OFF ([6][BM] fp32:
//   m0, alpha, m1, beta, then each consumer's row sums at the end).
#pragma once
#include "kgen/wgmma_ring.cuh"

namespace kgen {

template <int HEADS_, int D_, int DV_, int BN_, int STAGES_, bool KV_FP8_, bool KV_SCALED_, class Layout>
struct SeesawAttnConfig : WgRing<HEADS_, D_, DV_, BN_, STAGES_, KV_FP8_, KV_SCALED_, Layout> {
    using Ring = WgRing<HEADS_, D_, DV_, BN_, STAGES_, KV_FP8_, KV_SCALED_, Layout>;
    using Ring::BM, Ring::D, Ring::DV, Ring::BN, Ring::KV_FP8, Ring::KV_SCALED, Ring::WG_DV, Ring::BLOCK_STEPS;
    using typename Ring::Row;
    using Layout::Q_REG_STEPS, Layout::Q_SLABS;
    static constexpr int K_STEPS = D / 16;                     // Q·K's k16 steps (every consumer does all)
    static constexpr int Q_SMEM_STEPS = K_STEPS - Q_REG_STEPS;  // the first ones read Q from shared memory
    // named barriers of the 256 consumer threads: Q staged / row sums in; consumer 0's max and alpha
    // are in; consumer 1's max and beta; consumer 0's probability tile; consumer 1's
    static constexpr int EXCHANGE_BAR = 1, MAX0_BAR = 2, MAX1_BAR = 3, P0_BAR = 4, P1_BAR = 5;
    enum RowValue { M0, ALPHA, M1, BETA, SUM0, SUM1 };  // ROW_OFF's [6][BM] fp32

    static_assert(D - DV == 64 && WG_DV == 256, "written for 64 rope dims and m64n256 P·V");
    static_assert(BN == 32, "Q·K uses m64n32k16 wgmmas; a probability tile's row is 64 of its 128 bytes");
    static_assert(Q_REG_STEPS % 4 == 0 && Q_SLABS * 4 == Q_SMEM_STEPS, "Q's smem part is whole column blocks");
    static_assert(Layout::P_OFF % 1024 == 0 && Layout::P_TILE == BM * 128, "probability tiles are swizzled blocks");
    static_assert(!KV_SCALED || (KV_FP8 && Q_SMEM_STEPS == 4 * BLOCK_STEPS && Row::SCALE_BLOCK * 2 == WG_DV),
                  "DSA rows: Q's smem part is the 4 scale blocks, a consumer's value dims two of them");
};

// A consumer's descriptors (stage 0, k-step 0): K (K-major), Q's smem part, V for its value dims
// (N-major: 64-dim blocks SLAB apart), and both probability tiles (K-major, like Q).
struct SsDescs {
    unsigned long long k, q, v, p[2];
    template <class C>
    __device__ __forceinline__ static SsDescs of(char* smem, int c) {
        return {sw128_desc(smem, 16, 1024), sw128_desc(smem + C::Q_SMEM_OFF, 16, 1024),
                sw128_desc(smem + dim_offset(c * C::WG_DV, C::SLAB), C::SLAB, 1024),
                {sw128_desc(smem + C::P_OFF, 16, 1024), sw128_desc(smem + C::P_OFF + C::P_TILE, 16, 1024)}};
    }
};

// Per-row values the consumers pass each other (row r of the CTA's BM).
template <class C>
__device__ __forceinline__ float* row_value(char* smem, int what, int r) {
    return reinterpret_cast<float*>(smem + C::ROW_OFF) + what * C::BM + r;
}

// Wait for ring position `pos`: a consumer waits for every stage it reads (the other's P·V too).
template <class C>
__device__ __forceinline__ int ss_wait_full(char* smem, int pos) {
    const int stage = ring_wait_full<C>(smem, pos);
    fence_async_shared();
    return stage;
}

// One k-step of Q·K into acc: Q from shared memory (its first Q_SMEM_STEPS) or registers.
template <class C>
__device__ __forceinline__ void ss_qk_step(float (&acc)[16], const WgConsumer<C>& st, const SsDescs& d,
                                           unsigned long long k, int ks, bool accumulate) {
    const unsigned long long kd = desc_add(k, dim_offset(16 * ks, C::SLAB));
    if (ks < C::Q_SMEM_STEPS)
        wgmma_m64n32k16_ss(acc, desc_add(d.q, dim_offset(16 * ks, C::Q_SLAB)), kd, accumulate);
    else
        wgmma_m64n32k16(acc, st.qf[ks < C::Q_SMEM_STEPS ? 0 : ks - C::Q_SMEM_STEPS], kd, accumulate);
}

// DSA rows: s += scale_b(key) x acc, block b's partial scores.
template <class C>
__device__ __forceinline__ void ss_fold(float (&s)[16], const float (&acc)[16], const float* scales, int b) {
    const WgCoords w = WgCoords::of();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float scale = scales[(8 * i + 2 * w.t + e) * 4 + b];
            s[4 * i + e] = fmaf(scale, acc[4 * i + e], s[4 * i + e]);
            s[4 * i + 2 + e] = fmaf(scale, acc[4 * i + 2 + e], s[4 * i + 2 + e]);
        }
}

// s = Q K^T of ring position `pos` over all D dims, done when it returns. DSA rows: the rope into s,
// then block b into acc[b % 2], folded into s once in (block b + 1 runs meanwhile).
template <class C>
__device__ __forceinline__ void ss_scores(char* smem, const WgConsumer<C>& st, const SsDescs& d, int pos,
                                          float (&s)[16]) {
    const int stage = ss_wait_full<C>(smem, pos);
    const unsigned long long k = desc_add(d.k, stage * C::STAGE_BYTES);
    wgmma_fence();
    if constexpr (C::KV_SCALED) {
        const float* scales = stage_scales<C>(smem, stage);
        float acc[2][16];
        auto block = [&](int b) {
#pragma unroll
            for (int j = 0; j < C::BLOCK_STEPS; ++j) ss_qk_step<C>(acc[b % 2], st, d, k, b * C::BLOCK_STEPS + j, j != 0);
            wgmma_commit();
        };
#pragma unroll
        for (int ks = C::Q_SMEM_STEPS; ks < C::K_STEPS; ++ks) ss_qk_step<C>(s, st, d, k, ks, ks != C::Q_SMEM_STEPS);
        block(0);
        block(1);
        wgmma_wait<1>();  // the rope and block 0
        ss_fold<C>(s, acc[0], scales, 0);
        wgmma_fence();
        block(2);
        wgmma_wait<1>();
        ss_fold<C>(s, acc[1], scales, 1);
        wgmma_fence();
        block(3);
        wgmma_wait<1>();
        ss_fold<C>(s, acc[0], scales, 2);
        wgmma_wait<0>();
        ss_fold<C>(s, acc[1], scales, 3);
    } else {
#pragma unroll
        for (int ks = 0; ks < C::K_STEPS; ++ks) ss_qk_step<C>(s, st, d, k, ks, ks != 0);
        wgmma_commit();
        wgmma_wait<0>();
    }
}

// Write packed probabilities into consumer `c`'s tile for the other consumer: word k of k-step kk
// is row g + 8 (k % 2), keys 16kk + 8 (k / 2) + 2t, +1 (16-byte chunk 2kk + k / 2 of the row; DSA
// rows: pf[j] in the row's half j, chunks 4j ..).
template <class C>
__device__ __forceinline__ void ss_share_p(char* smem, int c, const WgP<C>& pf) {
    const WgCoords w = WgCoords::of();
    char* tile = smem + C::P_OFF + c * C::P_TILE;
#pragma unroll
    for (int j = 0; j < (C::KV_SCALED ? 2 : 1); ++j)
#pragma unroll
        for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int row = w.warp * 16 + w.g + 8 * (k % 2), chunk = 4 * j + 2 * kk + k / 2;
                *reinterpret_cast<unsigned*>(tile + sw128_offset(row, chunk) + 4 * w.t) = pf[j][kk][k];
            }
    fence_async_shared();  // the other consumer's wgmma reads it (async proxy)
}

// Issue (and commit) O += P · V_c of ring position `pos` with P from a probability tile in shared
// memory (the other consumer's; wg_issue_pv takes it from registers). DSA rows: per value block, its
// P in the tile rows' half.
template <class C>
__device__ __forceinline__ void ss_issue_pv_shared(WgConsumer<C>& st, const SsDescs& d, int pos,
                                                   unsigned long long p_desc) {
    const unsigned long long v = desc_add(d.v, (pos % C::STAGES) * C::STAGE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk) {
        if constexpr (C::KV_SCALED) {
            wgmma_m64n128k16_ss_bt(st.o[0], desc_add(p_desc, kk * 32), desc_add(v, kk * 16 * 128), true);
            wgmma_m64n128k16_ss_bt(st.o[1], desc_add(p_desc, 64 + kk * 32), desc_add(v, 2 * C::SLAB + kk * 16 * 128),
                                   true);
        } else {
            wgmma_m64n256k16_ss_bt(st.o[0], st.o[1], desc_add(p_desc, kk * 32), desc_add(v, kk * 16 * 128), true);
        }
    }
    wgmma_commit();
}

// Consumer 0's tile at ring position `pos` (key tile `tile`): its scores, its step of the online
// softmax (m0 and alpha to consumer 1), O_lo += P_a V_a issued; s keeps P_a in fp32.
template <class C, class Visible>
__device__ __forceinline__ void ss_first_tile(char* smem, WgConsumer<C>& st, const SsDescs& d, int pos, int tile,
                                              int num_keys, const Visible& visible, float scale_log2,
                                              float (&s)[16], WgP<C>& pf) {
    const WgCoords w = WgCoords::of();
    ss_scores<C>(smem, st, d, pos, s);
    wg_mask<C>(s, tile, num_keys, visible);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const SoftmaxStep step = online_softmax_step<C::MAX_SLACK>(st.row_max[h], wg_row_max(s, h) * scale_log2);
        alpha[h] = step.alpha;
        st.row_sum[h] = st.row_sum[h] * alpha[h] + wg_exp_row(s, h, scale_log2, step.ref);
        if (w.t == 0) {
            const int r = w.warp * 16 + w.g + 8 * h;
            *row_value<C>(smem, C::M0, r) = st.row_max[h];
            *row_value<C>(smem, C::ALPHA, r) = alpha[h];
        }
    }
    named_arrive(C::MAX0_BAR, 256);
    wg_rescale_o<C>(st, alpha);
    wg_pack_p<C>(s, {1.f, 1.f}, ring_scales<C>(smem, pos), 0, pf);
    wg_issue_pv<C>(st, d.v, pos, pf);
}

// Consumer 0 over tiles a (position pos) and b (pos + 1) of a pair.
template <class C, class Visible>
__device__ __forceinline__ void ss_first_pair(char* smem, WgConsumer<C>& st, const SsDescs& d, int pos, int tile,
                                              int num_keys, const Visible& visible, float scale_log2) {
    const WgCoords w = WgCoords::of();
    float s[16];
    WgP<C> pf;
    ss_first_tile<C>(smem, st, d, pos, tile, num_keys, visible, scale_log2, s, pf);
    named_barrier(C::MAX1_BAR, 256);  // consumer 1's m1 and beta
    float beta[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = w.warp * 16 + w.g + 8 * h;
        beta[h] = *row_value<C>(smem, C::BETA, r);
        st.row_max[h] = *row_value<C>(smem, C::M1, r);
    }
    WgP<C> shared;
    wg_pack_p<C>(s, beta, ring_scales<C>(smem, pos), 2, shared);
    ss_share_p<C>(smem, 0, shared);  // beta P_a (DSA rows: times consumer 1's block scales) for consumer 1
    named_arrive(C::P0_BAR, 256);
    wgmma_wait<0>();  // O_lo += P_a V_a is done: O is free
    wg_release(ring_empty<C>(smem, pos % C::STAGES));
    wg_rescale_o<C>(st, beta);
    st.row_sum[0] *= beta[0];
    st.row_sum[1] *= beta[1];
    ss_wait_full<C>(smem, pos + 1);
    named_barrier(C::P1_BAR, 256);  // consumer 1's P_b
    ss_issue_pv_shared<C>(st, d, pos + 1, d.p[1]);
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, (pos + 1) % C::STAGES));
}

// Consumer 0 over a range's last tile when it has no pair: consumer 1 adds P_a V_a to its half.
template <class C, class Visible>
__device__ __forceinline__ void ss_first_single(char* smem, WgConsumer<C>& st, const SsDescs& d, int pos, int tile,
                                                int num_keys, const Visible& visible, float scale_log2) {
    float s[16];
    WgP<C> pf;
    ss_first_tile<C>(smem, st, d, pos, tile, num_keys, visible, scale_log2, s, pf);
    named_barrier(C::MAX1_BAR, 256);  // consumer 1 is done with the probability tiles
    WgP<C> shared;
    wg_pack_p<C>(s, {1.f, 1.f}, ring_scales<C>(smem, pos), 2, shared);
    ss_share_p<C>(smem, 0, shared);
    named_arrive(C::P0_BAR, 256);
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, pos % C::STAGES));
}

// Consumer 1 over tiles a (position pos) and b (pos + 1) of a pair.
template <class C, class Visible>
__device__ __forceinline__ void ss_second_pair(char* smem, WgConsumer<C>& st, const SsDescs& d, int pos, int tile,
                                               int num_keys, const Visible& visible, float scale_log2) {
    const WgCoords w = WgCoords::of();
    float s[16];
    ss_scores<C>(smem, st, d, pos + 1, s);
    wg_mask<C>(s, tile + 1, num_keys, visible);
    const float tile_max[2] = {wg_row_max(s, 0) * scale_log2, wg_row_max(s, 1) * scale_log2};
    named_barrier(C::MAX0_BAR, 256);  // consumer 0's m0 and alpha
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = w.warp * 16 + w.g + 8 * h;
        st.row_max[h] = *row_value<C>(smem, C::M0, r);
        const SoftmaxStep step = online_softmax_step<C::MAX_SLACK>(st.row_max[h], tile_max[h]);  // alpha of this step: beta
        factor[h] = *row_value<C>(smem, C::ALPHA, r) * step.alpha;
        st.row_sum[h] = st.row_sum[h] * factor[h] + wg_exp_row(s, h, scale_log2, step.ref);
        if (w.t == 0) {
            *row_value<C>(smem, C::M1, r) = st.row_max[h];
            *row_value<C>(smem, C::BETA, r) = step.alpha;
        }
    }
    named_arrive(C::MAX1_BAR, 256);
    wg_rescale_o<C>(st, factor);
    WgP<C> pf;
    wg_pack_p<C>(s, {1.f, 1.f}, ring_scales<C>(smem, pos + 1), 2, pf);
    if constexpr (C::KV_SCALED) {  // consumer 0's blocks' P
        WgP<C> shared;
        wg_pack_p<C>(s, {1.f, 1.f}, ring_scales<C>(smem, pos + 1), 0, shared);
        ss_share_p<C>(smem, 1, shared);
    } else {
        ss_share_p<C>(smem, 1, pf);
    }
    named_arrive(C::P1_BAR, 256);
    wg_issue_pv<C>(st, d.v, pos + 1, pf);
    ss_wait_full<C>(smem, pos);
    named_barrier(C::P0_BAR, 256);  // consumer 0's beta P_a
    ss_issue_pv_shared<C>(st, d, pos, d.p[0]);
    wgmma_wait<1>();
    wg_release(ring_empty<C>(smem, (pos + 1) % C::STAGES));
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, pos % C::STAGES));
}

// Consumer 1 over a range's last tile when it has no pair: consumer 0's step, then P_a V_a.
template <class C>
__device__ __forceinline__ void ss_second_single(char* smem, WgConsumer<C>& st, const SsDescs& d, int pos) {
    const WgCoords w = WgCoords::of();
    named_barrier(C::MAX0_BAR, 256);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = w.warp * 16 + w.g + 8 * h;
        st.row_max[h] = *row_value<C>(smem, C::M0, r);
        alpha[h] = *row_value<C>(smem, C::ALPHA, r);
        st.row_sum[h] *= alpha[h];
    }
    named_arrive(C::MAX1_BAR, 256);
    wg_rescale_o<C>(st, alpha);
    ss_wait_full<C>(smem, pos);
    named_barrier(C::P0_BAR, 256);
    ss_issue_pv_shared<C>(st, d, pos, d.p[0]);
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, pos % C::STAGES));
}

// Consumer ROLE over the staged tiles of a range: pairs, then the odd tile; continues the online
// softmax in `st`.
template <class C, int ROLE, class Visible>
__device__ __forceinline__ void ss_consume(char* smem, WgConsumer<C>& st, int& ring_pos, int num_keys,
                                           const Visible& visible, int tile_begin, int tile_end, float scale_log2) {
    if (tile_begin >= tile_end) return;
    const SsDescs d = SsDescs::of<C>(smem, ROLE);
    const int pos0 = ring_pos - tile_begin;  // ring position of tile t: pos0 + t
    int tile = tile_begin;
    for (; tile + 1 < tile_end; tile += 2) {
        if constexpr (ROLE == 0)
            ss_first_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2);
        else
            ss_second_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2);
    }
    if (tile < tile_end) {
        if constexpr (ROLE == 0)
            ss_first_single<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2);
        else
            ss_second_single<C>(smem, st, d, pos0 + tile);
    }
    ring_pos = pos0 + tile_end;
}

// Both consumers' row sums make l (exchanged through ROW_OFF, a row half at a time); write this
// consumer's half of part_o[BM][DV] normalized (times out_scale: per-tensor rows' kv_scale), and
// (consumer 0) part_lse[BM] (natural log; -inf for rows that saw nothing).
template <class C, int ROLE>
__device__ __forceinline__ void ss_end(char* smem, const WgConsumer<C>& st, float* __restrict__ part_o,
                                       float* __restrict__ part_lse, float out_scale) {
    const WgCoords w = WgCoords::of();
    auto total = [&](int h, float sum) {  // this consumer's sum of row h, and the other's
        const int r = w.warp * 16 + w.g + 8 * h;
        if (w.t == 0) *row_value<C>(smem, C::SUM0 + ROLE, r) = sum;
        named_barrier(C::EXCHANGE_BAR, 256);
        return sum + *row_value<C>(smem, C::SUM1 - ROLE, r);
    };
    wg_store_state<C>(st, ROLE, total, out_scale, part_o, part_lse);
}

// Consumer ROLE's whole part: Q, the ranges, the partial state. A per-tensor fp8 cache's kv_scale
// multiplies the scores (folded into scale_log2) and O.
template <class C, int ROLE, class QRows, class First, class SecondFn>
__device__ __forceinline__ void ss_consumer(char* smem, const QRows& q_rows, int num_rows, float scale_log2,
                                            float kv_scale, const First& first, const SecondFn& second_fn,
                                            float* __restrict__ part_o, float* __restrict__ part_lse) {
    constexpr bool PER_TENSOR = C::KV_FP8 && !C::KV_SCALED;
    if constexpr (PER_TENSOR) scale_log2 *= kv_scale;
    WgConsumer<C> st;
    wg_begin<C>(smem, st, q_rows, num_rows, [](int, int ks) { return (C::Q_SMEM_STEPS + ks) * 16; },
                [](int slab) { return 64 * slab; });
    int ring_pos = 0;
    ss_consume<C, ROLE>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);
    const auto second = second_fn();
    if constexpr (is_key_range<decltype(second_fn())>)
        ss_consume<C, ROLE>(smem, st, ring_pos, second.num_keys, second.visible, second.tile_begin, second.tile_end,
                            scale_log2);
    ss_end<C, ROLE>(smem, st, part_o, part_lse, PER_TENSOR ? kv_scale : 1.f);
}

// Attention of the CTA's BM query rows over the key range `first`, then the range second() returns
// (NoKeys: none; made once the first is done), one online softmax; writes the partial state to
// part_o / part_lse. Every thread calls it. kv_scale: per-tensor fp8 rows' (others have none).
template <class C, class QRows, class First, class SecondFn>
__device__ __forceinline__ void attend(char* smem_raw, const QRows& q_rows, int num_rows, float scale_log2,
                                       float kv_scale, const First& first, const SecondFn& second_fn,
                                       float* __restrict__ part_o, float* __restrict__ part_lse) {
    // a stage is full after every producer thread's copies (fp8: its conversion; DSA rows: and its cp.async arrival)
    char* smem = wg_setup<C>(smem_raw, C::KV_SCALED ? 2 * 128 : 128);
    if (threadIdx.x < 128) {
        wg_producer<C>(smem, first, second_fn);
    } else {
        setmaxnreg_inc<C::CONSUMER_REGS>();
        if (threadIdx.x < 256)
            ss_consumer<C, 0>(smem, q_rows, num_rows, scale_log2, kv_scale, first, second_fn, part_o, part_lse);
        else
            ss_consumer<C, 1>(smem, q_rows, num_rows, scale_log2, kv_scale, first, second_fn, part_o, part_lse);
    }
}

}  // namespace kgen
