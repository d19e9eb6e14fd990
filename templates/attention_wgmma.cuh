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
//   consumers split the work by dims. Consumer c takes Q's k-steps 2j + c (16 dims each): the first
//   Q_REG_STEPS from registers (A operand), the rest from a swizzled copy of Q's last dims in
//   shared memory, and holds O's value dims [c*DV/2, (c+1)*DV/2) as its accumulator. Interleaved
//   k-steps keep each consumer's descriptors a constant apart.
// - Per tile each consumer computes a partial score S_c = Q_c K_c^T (m64n32 wgmmas), the two
//   exchange partials through shared memory (double-buffered by tile parity), both run the same
//   online softmax on S_0 + S_1 (so they agree on max and sum without talking), and each adds
//   P V_c (m64n256 wgmmas, P from registers, V N-major: the same staged rows).
// - Software pipelining (wg_consume): tile j's QK is issued, then tile j-1's P·V, which runs on the
//   tensor cores during tile j's exchange and softmax.
// - Registers: the producer gives its registers to the consumers (setmaxnreg, 240 each): Q
//   (4 per register k-step), O (128), scores (16) and P (8); with all of Q in registers ptxas
//   serializes the wgmmas. Q's smem part costs 2 KB of shared-memory reads per k-step and tile.
// - fp8 rows (KV_FP8: e4m3 with one kv_scale): the consumers run unchanged on a bf16 ring. The
//   producer copies each tile's raw rows into one of two raw stages (cp.async, a tile ahead) and
//   converts them into the ring, exactly (e4m3 is a subset of bf16); kv_scale multiplies the
//   scores and O instead. (The DSA pool's rows are not taken: e4m3 x block scale rounded to bf16
//   misses the f16 mode's tolerance; bench/NOTES.md v17.)
#pragma once
#include "kgen/rows.cuh"
#include "kgen/wgmma_ptx.cuh"

namespace kgen {

// Layout: the CTA's shared memory (bytes from a 1024-aligned base), rendered by
// kgen/designs/wgmma.py (the planner's budget): the ring of STAGES tiles of STAGE_BYTES (D/64
// swizzled column blocks of SLAB bytes), Q's dims from Q_SMEM_DIM0 on at Q_SMEM_OFF (column blocks of
// Q_SLAB bytes; the first Q_REG_STEPS k-steps of each consumer stay in registers), the partial-score
// exchange at X_OFF ([tile parity][consumer][BM * BN] fp32), the barriers at BAR_OFF, ALIGN_SLACK to
// align the base up, SMEM_BYTES in all, and SCRATCH_OFF: the schedule's scratch (free until the
// first tile).
template <int HEADS_, int D_, int DV_, int BN_, int STAGES_, bool KV_FP8_, class Layout>
struct WgmmaAttnConfig : Layout {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = 64, BN = BN_, STAGES = STAGES_;
    static constexpr bool KV_FP8 = KV_FP8_;  // e4m3 rows (one kv_scale), converted into the bf16 ring by the producer
    static constexpr int KV_ROW = KV_FP8 ? D : D * 2;  // bytes per KV row in the cache (and in a raw stage)
    static constexpr int THREADS = 3 * 128;   // producer warpgroup, two consumer warpgroups
    static constexpr int CONSUMER_WARPS = 8;
    using Layout::Q_REG_STEPS, Layout::Q_SMEM_DIM0, Layout::SLAB, Layout::STAGE_BYTES;
    static constexpr int WG_K_STEPS = D / 32;    // all of a consumer's k16 steps (the rest: Q in smem)
    static constexpr int WG_DV = DV / 2;       // value dims per consumer
    static constexpr int ROW_CHUNKS = D * 2 / 16;  // 16-byte chunks per KV row
    static constexpr int ROW_THREADS = 128 / BN;   // producer threads per staged row
    static constexpr int X_FLOATS = BM * BN;  // one consumer's partial scores of a tile
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;  // 128 * 24 + 256 * 240 <= 384 * 168
    static constexpr int EXCHANGE_BAR = 1;  // named barrier of the 256 consumer threads

    static_assert(D % 64 == 0 && DV % 64 == 0 && WG_DV == 256, "the loop is written for 64-dim column blocks and m64n256 P·V");
    static_assert(BN == 32, "QK uses m64n32k16 wgmmas");
    static_assert(128 % BN == 0 && ROW_CHUNKS % ROW_THREADS == 0, "producer layout");
    static_assert(SLAB == BN * 128 && STAGE_BYTES == (D / 64) * SLAB && STAGE_BYTES % 1024 == 0,
                  "swizzled tiles of 128-byte rows start 1024-byte aligned");
    static_assert(Q_SMEM_DIM0 == 2 * Q_REG_STEPS * 16 && Q_SMEM_DIM0 % 64 == 0 && Q_SMEM_DIM0 < D,
                  "Q's smem part is whole column blocks after the register k-steps");
    static_assert(Layout::SMEM_BYTES >= Layout::BAR_OFF + 2 * STAGES * 8 + 1023, "barriers and alignment slack fit");
};

// ---- fp8 rows: raw stages and their conversion into the bf16 ring ----

// The 4 e4m3 values of v (byte 0 first) as two bf16x2 words: e4m3 -> f16 -> f32 -> bf16, each
// step exact (e4m3 has 3 mantissa bits).
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(unsigned v) {
    const unsigned lo = e4m3x2_to_f16x2(v), hi = e4m3x2_to_f16x2(v >> 16);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return {pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y)};
}

// 16 bytes of bf16 (dims 8 * chunk .. + 7 of a row) at their place in a swizzled stage.
template <class C>
__device__ __forceinline__ char* stage_chunk(char* stage, int row, int chunk) {
    return stage + (chunk / 8) * C::SLAB + sw128_offset(row, chunk % 8);
}

// A raw stage holds BN rows of e4m3 bytes. Producer thread `sub` of row `row` copies the row's
// 16-byte chunks sub, sub + ROW_THREADS, ... into it and converts the same chunks, so every raw
// byte a producer thread reads it copied itself and the producers never wait for each other.
template <class C>
__device__ __forceinline__ void copy_raw_row(char* raw_stage, const char* src, int row, int sub) {
    char* raw = raw_stage + row * C::KV_ROW;
#pragma unroll
    for (int c = sub; c < C::D / 16; c += C::ROW_THREADS) cp_async16(raw + c * 16, src + c * 16);
}

template <class C>
__device__ __forceinline__ void convert_row(const char* raw_stage, char* stage, int row, int sub) {
    const char* raw = raw_stage + row * C::KV_ROW;
#pragma unroll 1  // rolled: the producer has 24 registers
    for (int c = sub; c < C::D / 16; c += C::ROW_THREADS) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + c * 16);
        const uint2 a = e4m3x4_to_bf16x4(v.x), b = e4m3x4_to_bf16x4(v.y);
        const uint2 d = e4m3x4_to_bf16x4(v.z), e = e4m3x4_to_bf16x4(v.w);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c)) = make_uint4(a.x, a.y, b.x, b.y);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c + 1)) = make_uint4(d.x, d.y, e.x, e.y);
    }
}

// The producer over fp8 rows: tile t + 1's raw rows are copied while tile t is converted into the
// ring stage the consumers freed; fenced for wgmma's reads (async proxy), then the thread arrives.
template <class C, class Keys>
__device__ __forceinline__ void wg_produce_fp8(char* smem, int& ring_pos, const Keys& keys, int num_keys,
                                               int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row = threadIdx.x / C::ROW_THREADS, sub = threadIdx.x % C::ROW_THREADS;
    auto raw_stage = [&](int tile) { return smem + C::RAW_OFF + (tile % 2) * C::RAW_STAGE_BYTES; };
    auto copy = [&](int tile) {
        const PendingRow p = fetch_row<C::BN>(tile, row, num_keys, keys);
        copy_raw_row<C>(raw_stage(tile), keys.row(p.j, p.fetched), row, sub);
    };
    copy(tile_begin);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++ring_pos) {
        cp_async_wait_all();  // this thread's copies of tile
        if (tile + 1 < tile_end) copy(tile + 1);
        const int stage = ring_wait_free<C>(smem, ring_pos);
        convert_row<C>(raw_stage(tile), smem + stage * C::STAGE_BYTES, row, sub);
        fence_async_shared();
        mbar_arrive(ring_full<C>(smem, stage));
    }
}

// Producer thread p (of 128) stages 16-byte chunks sub, sub + ROW_THREADS, ... of row p / ROW_THREADS
// of every tile of the range, as soon as the consumers free a stage.
template <class C, class Keys>
__device__ __forceinline__ void wg_produce(char* smem, int& ring_pos, const Keys& keys, int num_keys, int tile_begin,
                                           int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row = threadIdx.x / C::ROW_THREADS, sub = threadIdx.x % C::ROW_THREADS;
    PendingRow next = fetch_row<C::BN>(tile_begin, row, num_keys, keys);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++ring_pos) {
        const PendingRow cur = next;
        if (tile + 1 < tile_end) next = fetch_row<C::BN>(tile + 1, row, num_keys, keys);
        const int stage = ring_wait_free<C>(smem, ring_pos);
        const char* src = keys.row(cur.j, cur.fetched);
        char* dst = smem + stage * C::STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < C::ROW_CHUNKS / C::ROW_THREADS; ++i) {
            const int chunk = sub + i * C::ROW_THREADS;
            cp_async16(dst + (chunk / 8) * C::SLAB + sw128_offset(row, chunk % 8), src + chunk * 16);
        }
        cp_async_arrive(ring_full<C>(smem, stage));
    }
}

// A consumer thread's state: Q fragments of its k-steps, O accumulator of its value dims, and the
// online softmax of its two rows (g and g + 8 of its warp's 16): running max (log2 domain) and
// this thread's share of the running sum.
template <class C>
struct WgConsumer {
    unsigned qf[C::Q_REG_STEPS][4];
    float o[C::WG_DV / 2];
    float row_max[2], row_sum[2];
};

// A consumer thread's coordinates: consumer (0/1), warp in the warpgroup, fragment row g and
// column pair t. Recomputed where needed rather than held through the loop (registers are short).
struct WgCoords {
    int c, warp, g, t;
    __device__ __forceinline__ static WgCoords of() {
        return {static_cast<int>(threadIdx.x) / 128 - 1, static_cast<int>(threadIdx.x / 32) % 4,
                static_cast<int>(threadIdx.x % 32) / 4, static_cast<int>(threadIdx.x) % 4};
    }
};

// Descriptor `desc` moved `bytes` further into shared memory (the start address field is in 16 B).
__device__ __forceinline__ unsigned long long desc_add(unsigned long long desc, int bytes) { return desc + (bytes >> 4); }

// Byte offset of a consumer's k-step ks in a swizzled tile of `slab`-byte column blocks, less the
// consumer's c * 32: k-step 2ks + c is 32 bytes at (2ks + c) % 4 into column block ks / 2.
__device__ __forceinline__ int k_step_offset(int ks, int slab) { return (ks / 2) * slab + (ks % 2) * 64; }

// Load this consumer's register-resident Q fragments; both consumers stage the rest of Q into
// shared memory.
template <class C, class QRows>
__device__ __forceinline__ void wg_begin(char* smem, WgConsumer<C>& st, const QRows& q_rows, int num_rows) {
    const WgCoords w = WgCoords::of();
    // Rows past num_rows repeat the last row: padding, never written back as a result.
    const int r = w.warp * 16 + w.g;
    const char* lo = q_rows.row(min(r, num_rows - 1), 0);
    const char* hi = q_rows.row(min(r + 8, num_rows - 1), 0);
#pragma unroll
    for (int ks = 0; ks < C::Q_REG_STEPS; ++ks) {
        const int d = ((2 * ks + w.c) * 16 + 2 * w.t) * 2;  // byte offset in a bf16 row
        st.qf[ks][0] = __ldg(reinterpret_cast<const unsigned*>(lo + d));
        st.qf[ks][1] = __ldg(reinterpret_cast<const unsigned*>(hi + d));
        st.qf[ks][2] = __ldg(reinterpret_cast<const unsigned*>(lo + d + 16));
        st.qf[ks][3] = __ldg(reinterpret_cast<const unsigned*>(hi + d + 16));
    }
    constexpr int Q_CHUNKS = C::BM * (C::D - C::Q_SMEM_DIM0) * 2 / 16;  // 16-byte chunks of Q's smem part
    for (int i = threadIdx.x - 128; i < Q_CHUNKS; i += 256) {
        const int row = i % C::BM, chunk = i / C::BM;  // chunk of Q's smem part, 8 per column block
        const char* src = q_rows.row(min(row, num_rows - 1), 0) + C::Q_SMEM_DIM0 * 2;
        *reinterpret_cast<uint4*>(smem + C::Q_SMEM_OFF + (chunk / 8) * C::Q_SLAB + sw128_offset(row, chunk % 8)) =
            __ldg(reinterpret_cast<const uint4*>(src) + chunk);
    }
    fence_async_shared();  // Q's smem part is read by wgmma (async proxy)
    named_barrier(C::EXCHANGE_BAR, 256);
#pragma unroll
    for (int i = 0; i < C::WG_DV / 2; ++i) st.o[i] = 0.f;
    st.row_max[0] = st.row_max[1] = neg_inf();
    st.row_sum[0] = st.row_sum[1] = 0.f;
}

// Stage descriptors of a consumer: K for its k-steps (K-major; 8-row groups 1024 B apart, no
// leading offset inside a swizzled block), Q's smem-resident k-steps, V for its value dims
// (N-major: 64-dim blocks SLAB apart, 8-key groups 1024 B apart). Stage s is STAGE_BYTES further.
struct WgDescs {
    unsigned long long k, q, v;
    template <class C>
    __device__ __forceinline__ static WgDescs of(char* smem, int c) {
        return {sw128_desc(smem + c * 32, 16, 1024), sw128_desc(smem + C::Q_SMEM_OFF + c * 32, 16, 1024),
                sw128_desc(smem + 4 * c * C::SLAB, C::SLAB, 1024)};
    }
};

// Wait for ring position `pos`, then issue (and commit) this consumer's partial scores of it:
// s = Q_c K_c^T over its k-steps, from registers, then from Q's smem-resident dims.
template <class C>
__device__ __forceinline__ void wg_issue_qk(char* smem, const WgConsumer<C>& st, const WgDescs& d, int pos,
                                            float (&s)[16]) {
    const int stage = ring_wait_full<C>(smem, pos);
    fence_async_shared();
    const unsigned long long k_desc = desc_add(d.k, stage * C::STAGE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < C::Q_REG_STEPS; ++ks)
        wgmma_m64n32k16(s, st.qf[ks], desc_add(k_desc, k_step_offset(ks, C::SLAB)), ks > 0);
#pragma unroll
    for (int ks = C::Q_REG_STEPS; ks < C::WG_K_STEPS; ++ks)
        wgmma_m64n32k16_ss(s, desc_add(d.q, k_step_offset(ks - C::Q_REG_STEPS, C::Q_SLAB)),
                           desc_add(k_desc, k_step_offset(ks, C::SLAB)), true);
    wgmma_commit();
}

__device__ __forceinline__ void wg_release(mbarrier* empty) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);  // this warp is done with the stage
}

// Issue (and commit) O += P · V_c over ring position `pos`, P as the A operand.
template <class C>
__device__ __forceinline__ void wg_issue_pv(WgConsumer<C>& st, const WgDescs& d, int pos,
                                            const unsigned (&pf)[C::BN / 16][4]) {
    const unsigned long long v_desc = desc_add(d.v, (pos % C::STAGES) * C::STAGE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk)  // 16 keys a k-step: 2048 B of 128-byte rows
        wgmma_m64n256k16_bt(st.o, pf[kk], desc_add(v_desc, kk * 16 * 128), true);
    wgmma_commit();
}

// The scores of ring position `pos` (key tile `tile`): exchange the partials with the other
// consumer (same thread, same positions in both) and add them — a + b is order independent, so
// both consumers hold bit-identical scores — then the online softmax (base 2) of rows g (h = 0) and
// g + 8 (h = 1): s[4i + 2h + e] (key 8i + 2t + e) becomes its probability, alpha[h] the factor the
// row's O and sum are rescaled by.
template <class C, class Visible>
__device__ __forceinline__ void wg_softmax(char* smem, WgConsumer<C>& st, int pos, int tile, float (&s)[16],
                                           float (&alpha)[2], int num_keys, const Visible& visible, float scale_log2) {
    const WgCoords w = WgCoords::of();
    float* exchange = reinterpret_cast<float*>(smem + C::X_OFF);
    float* mine = exchange + ((pos & 1) * 2 + w.c) * C::X_FLOATS;
    const float* theirs = exchange + ((pos & 1) * 2 + 1 - w.c) * C::X_FLOATS;
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
    // Keys past the range and keys a row does not see score -inf (whole prefix tiles skip the test).
    if (!(Visible::ALL && (tile + 1) * C::BN <= num_keys)) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = tile * C::BN + 8 * i + 2 * w.t + e, r = w.warp * 16 + w.g + 8 * h;
                    if (!(key < num_keys && visible(r, key))) s[4 * i + 2 * h + e] = neg_inf();
                }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // Row max of the raw scores (the scale is positive, so it commutes with max), as a tree.
        float m = fmaxf(fmaxf(fmaxf(s[2 * h], s[2 * h + 1]), fmaxf(s[4 + 2 * h], s[5 + 2 * h])),
                        fmaxf(fmaxf(s[8 + 2 * h], s[9 + 2 * h]), fmaxf(s[12 + 2 * h], s[13 + 2 * h])));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const SoftmaxStep step = online_softmax_step(st.row_max[h], m * scale_log2);
        alpha[h] = step.alpha;
        float p[8];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                p[2 * i + e] = s[4 * i + 2 * h + e] = exp2_fast(fmaf(s[4 * i + 2 * h + e], scale_log2, -step.ref));
        st.row_sum[h] = st.row_sum[h] * alpha[h] + (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])));
    }
}

// Rescale O by the tile's alpha (skipped once the maxima settle: alpha is exactly 1) and pack the
// probabilities as P·V's A operand: k-step kk is score columns 16kk .. 16kk + 15. No P·V may be
// in flight (it reads pf and writes O).
template <class C>
__device__ __forceinline__ void wg_rescale_and_pack(WgConsumer<C>& st, const float (&s)[16], const float (&alpha)[2],
                                                    unsigned (&pf)[C::BN / 16][4]) {
    if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int j = 0; j < C::WG_DV / 8; ++j) {
            st.o[4 * j] *= alpha[0]; st.o[4 * j + 1] *= alpha[0];
            st.o[4 * j + 2] *= alpha[1]; st.o[4 * j + 3] *= alpha[1];
        }
    }
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
        for (int k = 0; k < 4; ++k) pf[kk][k] = pack_bf16x2(s[8 * kk + 2 * k], s[8 * kk + 2 * k + 1]);
}

// Attend over the staged tiles of a range, continuing the online softmax in `st`. Software
// pipelined: tile j's scores are issued first, then tile j-1's P·V, whose tensor-core work runs
// under tile j's exchange and softmax. The first tile is peeled so every wgmma in the loop is
// issued unconditionally (a wgmma under a runtime branch makes the compiler merge accumulator
// registers with moves, and ptxas then serializes all wgmmas).
template <class C, class Visible>
__device__ __forceinline__ void wg_consume(char* smem, WgConsumer<C>& st, int& ring_pos, int num_keys,
                                           const Visible& visible, int tile_begin, int tile_end, float scale_log2) {
    if (tile_begin >= tile_end) return;
    const WgDescs d = WgDescs::of<C>(smem, WgCoords::of().c);
    const int pos0 = ring_pos - tile_begin;  // ring position of tile t: pos0 + t
    unsigned pf[C::BN / 16][4];
    {
        float s[16], alpha[2];
        wg_issue_qk<C>(smem, st, d, pos0 + tile_begin, s);
        wgmma_wait<0>();
        wg_softmax<C>(smem, st, pos0 + tile_begin, tile_begin, s, alpha, num_keys, visible, scale_log2);
        wg_rescale_and_pack<C>(st, s, alpha, pf);
    }
    for (int tile = tile_begin + 1; tile < tile_end; ++tile) {
        const int pos = pos0 + tile;
        float s[16], alpha[2];
        wg_issue_qk<C>(smem, st, d, pos, s);
        wg_issue_pv<C>(st, d, pos - 1, pf);
        wgmma_wait<1>();  // QK of this tile is done; P·V of the last one may run on
        wg_softmax<C>(smem, st, pos, tile, s, alpha, num_keys, visible, scale_log2);
        wgmma_wait<0>();
        wg_release(ring_empty<C>(smem, (pos - 1) % C::STAGES));
        wg_rescale_and_pack<C>(st, s, alpha, pf);
    }
    wg_issue_pv<C>(st, d, pos0 + tile_end - 1, pf);
    wgmma_wait<0>();
    wg_release(ring_empty<C>(smem, (pos0 + tile_end - 1) % C::STAGES));
    ring_pos = pos0 + tile_end;
}

// Normalize and write this consumer's half of part_o[BM][DV]; consumer 0 writes part_lse[BM]
// (natural log; -inf for rows that saw nothing).
template <class C>
__device__ __forceinline__ void wg_end(const WgConsumer<C>& st, float* __restrict__ part_o, float* __restrict__ part_lse,
                                       float out_scale) {
    const WgCoords w = WgCoords::of();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = st.row_sum[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = row_inv_l(sum, out_scale);
        const int r = w.warp * 16 + w.g + 8 * h;
        if (w.c == 0 && w.t == 0) part_lse[r] = row_lse(st.row_max[h], sum);
        float* out = part_o + r * C::DV + w.c * C::WG_DV + 2 * w.t;
#pragma unroll
        for (int j = 0; j < C::WG_DV / 8; ++j)
            *reinterpret_cast<float2*>(out + 8 * j) = make_float2(st.o[4 * j + 2 * h] * inv, st.o[4 * j + 2 * h + 1] * inv);
    }
}

// Attention of the CTA's BM query rows over the key range `first`, then the range second() returns
// (NoKeys: none; made once the first is done), one online softmax; writes the partial state to
// part_o / part_lse. Every thread calls it.
// A per-tensor fp8 cache's kv_scale multiplies the scores (folded into scale_log2) and O (in wg_end).
template <class C, class QRows, class First, class SecondFn>
__device__ __forceinline__ void attend(char* smem_raw, const QRows& q_rows, int num_rows, float scale_log2,
                                       float kv_scale, const First& first, const SecondFn& second_fn,
                                       float* __restrict__ part_o, float* __restrict__ part_lse) {
    char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);  // swizzled tiles need 1024-byte alignment
    if (threadIdx.x == 0) {
        ring_init<C>(smem, 128, C::CONSUMER_WARPS);  // every producer thread's copies; every consumer warp
        mbar_init_fence();
    }
    __syncthreads();
    int ring_pos = 0;
    if (threadIdx.x < 128) {
        setmaxnreg_dec<C::PRODUCER_REGS>();
        auto produce = [&](const auto& range) {
            if constexpr (C::KV_FP8)
                wg_produce_fp8<C>(smem, ring_pos, range.keys, range.num_keys, range.tile_begin, range.tile_end);
            else
                wg_produce<C>(smem, ring_pos, range.keys, range.num_keys, range.tile_begin, range.tile_end);
        };
        produce(first);
        const auto second = second_fn();
        if constexpr (is_key_range<decltype(second_fn())>) produce(second);
        cp_async_wait_all();  // nothing of this thread is in flight when it exits
    } else {
        setmaxnreg_inc<C::CONSUMER_REGS>();
        if constexpr (C::KV_FP8) scale_log2 *= kv_scale;
        WgConsumer<C> st;
        wg_begin<C>(smem, st, q_rows, num_rows);
        wg_consume<C>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);
        const auto second = second_fn();
        if constexpr (is_key_range<decltype(second_fn())>)
            wg_consume<C>(smem, st, ring_pos, second.num_keys, second.visible, second.tile_begin, second.tile_end,
                          scale_log2);
        wg_end<C>(st, part_o, part_lse, C::KV_FP8 ? kv_scale : 1.f);
    }
}

}  // namespace kgen
