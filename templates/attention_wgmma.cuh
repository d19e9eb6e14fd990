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
#include "kgen/rows.cuh"
#include "kgen/wgmma_ptx.cuh"

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
struct WgmmaAttnConfig : Layout {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = 64, BN = BN_, STAGES = STAGES_;
    static constexpr bool KV_FP8 = KV_FP8_;        // e4m3 rows, converted into the bf16 ring by the producer
    static constexpr bool KV_SCALED = KV_SCALED_;  // the DSA pool's rows: per-block scales, bf16 rope
    using Row = ScaledRow<D, DV>;
    static constexpr int KV_ROW = KV_SCALED ? Row::BYTES : KV_FP8 ? D : D * 2;  // bytes per KV row in the cache
    static constexpr int THREADS = 3 * 128;   // producer warpgroup, two consumer warpgroups
    static constexpr int CONSUMER_WARPS = 8;
    using Layout::Q_REG_STEPS, Layout::Q_SLABS, Layout::SLAB, Layout::STAGE_BYTES;
    static constexpr int WG_DV = DV / 2;                 // value (latent) dims per consumer
    static constexpr int ROPE_HALF = (D - DV) / 2;       // rope dims per consumer
    static constexpr int LATENT_STEPS = WG_DV / 16;      // a consumer's latent k16 steps, then its rope steps
    static constexpr int WG_K_STEPS = LATENT_STEPS + ROPE_HALF / 16;
    static constexpr int Q_LATENT_SLABS = (WG_DV - 16 * Q_REG_STEPS) / 64;  // a consumer's latent Q column blocks in smem
    static constexpr int BLOCK_STEPS = Row::SCALE_BLOCK / 16;  // k-steps per scale block (DSA rows)
    static constexpr int ROW_CHUNKS = D * 2 / 16;  // 16-byte chunks of a staged (bf16) row
    // A raw stage's rows: the e4m3 bytes the producer converts (DSA rows: the latent; their scales
    // and rope are copied straight to the ring stage)
    static constexpr int RAW_ROW = KV_SCALED ? DV : KV_ROW;
    static constexpr int RAW_CHUNKS = RAW_ROW / 16;
    static constexpr int ROW_THREADS = 128 / BN;   // producer threads per staged row
    // 128 * P + 256 * C <= 384 * 168. fp8 rows: the producer's conversion is latency-bound with 24
    // (two chunks in flight); 40 bought the DSA rows 6-8% though the consumers spill a few words at 232.
    static constexpr int PRODUCER_REGS = KV_FP8 ? 40 : 24, CONSUMER_REGS = KV_FP8 ? 232 : 240;
    static constexpr int EXCHANGE_BAR = 1;  // named barrier of the 256 consumer threads
    static constexpr int PARTIAL_BAR = 2, SUM_BAR = 3;  // consumer 1's partial scores are in; consumer 0's sums are

    static_assert(D - DV == 64 && WG_DV == 256, "the loop is written for 64 rope dims (32 a consumer) and m64n256 P·V");
    static_assert(BN == 32, "QK uses m64n32k16 wgmmas");
    static_assert(128 % BN == 0 && ROW_CHUNKS % ROW_THREADS == 0 && RAW_CHUNKS % ROW_THREADS == 0 && KV_ROW % 16 == 0,
                  "producer layout");
    static_assert(SLAB == BN * 128 && STAGE_BYTES == (D / 64) * SLAB && STAGE_BYTES % 1024 == 0,
                  "swizzled tiles of 128-byte rows start 1024-byte aligned");
    static_assert(Q_REG_STEPS % 4 == 0 && Q_REG_STEPS <= LATENT_STEPS && Q_SLABS == 2 * Q_LATENT_SLABS + (D - DV) / 64,
                  "Q's smem part is whole column blocks after the register k-steps");
    static_assert(!KV_SCALED || (KV_FP8 && Row::SCALE_BLOCK * 2 == WG_DV && Row::SCALE_OFF % 16 == 0 &&
                                 Row::ROPE_OFF == Row::SCALE_OFF + 16 && Row::ROPE_OFF % 16 == 0),
                  "a consumer's latent dims are two scale blocks; the 4 scales are one 16-byte chunk, the rope after");
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
// (src is made opaque first: otherwise the compiler folds the row's slot * KV_ROW into every
// chunk's address, keeps a 64-bit offset per chunk live and spills the producer.)
template <class C>
__device__ __forceinline__ void copy_raw_row(char* raw_stage, const char* src, int row, int sub) {
    char* raw = raw_stage + row * C::RAW_ROW + sub * 16;
    src += sub * 16;
    asm("" : "+l"(src));  // then constant offsets: one address a row
#pragma unroll
    for (int i = 0; i < C::RAW_CHUNKS / C::ROW_THREADS; ++i)
        cp_async16(raw + i * C::ROW_THREADS * 16, src + i * C::ROW_THREADS * 16);
}

// A ring stage's block scales (DSA rows): [BN][4] fp32, each key's as its row stores them.
template <class C>
__device__ __forceinline__ float* stage_scales(char* smem, int stage) {
    return reinterpret_cast<float*>(smem + C::SCALE_OFF) + stage * C::BN * (C::DV / C::Row::SCALE_BLOCK);
}

// DSA rows: the rest of the row straight into ring stage `stage`: its bf16 rope chunks to their
// place (thread sub takes chunks sub, sub + ROW_THREADS, ...) and, by thread 0 of the row, its
// 4 block scales.
template <class C>
__device__ __forceinline__ void copy_row_rest(char* smem, int stage, const char* src, int row, int sub) {
    constexpr int ROPE_CHUNKS = (C::D - C::DV) * 2 / 16;
    static_assert(ROPE_CHUNKS % C::ROW_THREADS == 0, "rope chunks per producer thread");
    char* dst = smem + stage * C::STAGE_BYTES;
#pragma unroll
    for (int k = sub; k < ROPE_CHUNKS; k += C::ROW_THREADS)
        cp_async16(stage_chunk<C>(dst, row, C::DV / 8 + k), src + C::Row::ROPE_OFF + k * 16);
    if (sub == 0) cp_async16(stage_scales<C>(smem, stage) + row * 4, src + C::Row::SCALE_OFF);
}

// The e4m3 chunks of a raw row into the ring as bf16.
template <class C>
__device__ __forceinline__ void convert_row(const char* raw_stage, char* stage, int row, int sub) {
    const char* raw = raw_stage + row * C::RAW_ROW;
#pragma unroll 4  // chunks in flight: the conversion's latency is what the consumers wait for
    for (int c = sub; c < C::RAW_CHUNKS; c += C::ROW_THREADS) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + c * 16);
        const uint2 a = e4m3x4_to_bf16x4(v.x), b = e4m3x4_to_bf16x4(v.y);
        const uint2 d = e4m3x4_to_bf16x4(v.z), e = e4m3x4_to_bf16x4(v.w);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c)) = make_uint4(a.x, a.y, b.x, b.y);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c + 1)) = make_uint4(d.x, d.y, e.x, e.y);
    }
}

// The producer over fp8 rows: tile t + 1's raw rows are copied while tile t is converted into the
// ring stage the consumers freed; fenced for wgmma's reads (async proxy), then the thread arrives.
// DSA rows: once the stage is free the rest of tile t's rows is copied into it, and a cp.async
// arrival on the stage's barrier (tracking those copies, issued before tile t + 1's) counts too.
template <class C, class Keys>
__device__ __forceinline__ void wg_produce_fp8(char* smem, int& ring_pos, const Keys& keys, int num_keys,
                                               int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row = threadIdx.x / C::ROW_THREADS, sub = threadIdx.x % C::ROW_THREADS;
    auto raw_stage = [&](int tile) { return smem + C::RAW_OFF + (tile % 2) * C::RAW_STAGE_BYTES; };
    auto src = [&](int tile) {
        const PendingRow p = fetch_row<C::BN>(tile, row, num_keys, keys);
        return keys.row(p.j, p.fetched);
    };
    copy_raw_row<C>(raw_stage(tile_begin), src(tile_begin), row, sub);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++ring_pos) {
        cp_async_wait_all();  // this thread's copies of tile
        if constexpr (!C::KV_SCALED)
            if (tile + 1 < tile_end) copy_raw_row<C>(raw_stage(tile + 1), src(tile + 1), row, sub);
        const int stage = ring_wait_free<C>(smem, ring_pos);
        if constexpr (C::KV_SCALED) {  // the row's address again (its page id is in L1): fewer live registers
            copy_row_rest<C>(smem, stage, src(tile), row, sub);
            cp_async_arrive(ring_full<C>(smem, stage));
            if (tile + 1 < tile_end) copy_raw_row<C>(raw_stage(tile + 1), src(tile + 1), row, sub);
        }
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

// A consumer thread's state: Q fragments of its register k-steps, O accumulator of its value dims
// (columns 0..127 and 128..255: an m64n128 accumulator each), and the online softmax of its two rows
// (g and g + 8 of its warp's 16): running max (log2 domain) and this thread's share of the running sum.
template <class C>
struct WgConsumer {
    unsigned qf[C::Q_REG_STEPS > 0 ? C::Q_REG_STEPS : 1][4];
    float o[2][C::WG_DV / 4];
    float row_max[2], row_sum[2];
    __device__ __forceinline__ float& o_at(int i) { return o[i / (C::WG_DV / 4)][i % (C::WG_DV / 4)]; }
    __device__ __forceinline__ float o_at(int i) const { return o[i / (C::WG_DV / 4)][i % (C::WG_DV / 4)]; }
};

// A tile's scores in one consumer: s[4i + 2h + e] is row g + 8h, key 8i + 2t + e. DSA rows: s and
// blk take the consumer's two scale blocks (unscaled) until fold_blocks scales and adds them into
// s, and the rope's k-steps then accumulate onto s.
template <class C>
struct WgScores {
    float s[16];
    float blk[C::KV_SCALED ? 16 : 1];
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

// Byte offset of the 16 dims from `dim` in a tile of 64-dim swizzled column blocks of `slab` bytes.
__device__ __forceinline__ constexpr int dim_offset(int dim, int slab) { return dim / 64 * slab + dim % 64 * 2; }

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
        const int d = (step_dim<C>(w.c, ks) + 2 * w.t) * 2;  // byte offset in a bf16 row
        st.qf[ks][0] = __ldg(reinterpret_cast<const unsigned*>(lo + d));
        st.qf[ks][1] = __ldg(reinterpret_cast<const unsigned*>(hi + d));
        st.qf[ks][2] = __ldg(reinterpret_cast<const unsigned*>(lo + d + 16));
        st.qf[ks][3] = __ldg(reinterpret_cast<const unsigned*>(hi + d + 16));
    }
    // Q's smem part by cp.async, all of a thread's chunks in flight at once (through registers it
    // took one load's latency per chunk: 7% of the DSA rows' consumer samples), through L1 (a decode
    // tile's padding rows repeat its one real row: bench/NOTES.md v21).
    constexpr int Q_CHUNKS = C::BM * C::Q_SLABS * 8;  // 16-byte chunks of Q's smem part, 8 a column block row
    static_assert(Q_CHUNKS % 256 == 0, "every consumer thread copies as many of Q's chunks");
#pragma unroll
    for (int i = threadIdx.x - 128; i < Q_CHUNKS; i += 256) {
        const int row = i % C::BM, chunk = i / C::BM, slab = chunk / 8;
        const char* src = q_rows.row(min(row, num_rows - 1), 0) + (q_slab_dim0<C>(slab) + (chunk % 8) * 8) * 2;
        cp_async16_l1(smem + C::Q_SMEM_OFF + slab * C::Q_SLAB + sw128_offset(row, chunk % 8), src);
    }
    cp_async_wait_all();
    fence_async_shared();  // Q's smem part is read by wgmma (async proxy)
    named_barrier(C::EXCHANGE_BAR, 256);
#pragma unroll
    for (int i = 0; i < C::WG_DV / 2; ++i) st.o_at(i) = 0.f;
    st.row_max[0] = st.row_max[1] = neg_inf();
    st.row_sum[0] = st.row_sum[1] = 0.f;
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

__device__ __forceinline__ void wg_release(mbarrier* empty) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);  // this warp is done with the stage
}

// P·V's A operand: pf[b][kk] is k-step kk (16 keys) of P for value block b (DSA rows: the
// consumer's two scale blocks, P times each; otherwise pf[0] for all its value dims).
template <class C>
using WgP = unsigned[C::KV_SCALED ? 2 : 1][C::BN / 16][4];

// Issue (and commit) O += P · V_c over ring position `pos`, P as the A operand.
template <class C>
__device__ __forceinline__ void wg_issue_pv(WgConsumer<C>& st, const WgDescs& d, int pos, const WgP<C>& pf) {
    const unsigned long long v_desc = desc_add(d.v, (pos % C::STAGES) * C::STAGE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk) {  // 16 keys a k-step: 2048 B of 128-byte rows
        if constexpr (C::KV_SCALED) {
            wgmma_m64n128k16_bt(st.o[0], pf[0][kk], desc_add(v_desc, kk * 16 * 128), true);
            wgmma_m64n128k16_bt(st.o[1], pf[1][kk], desc_add(v_desc, 2 * C::SLAB + kk * 16 * 128), true);
        } else {
            wgmma_m64n256k16_bt(st.o[0], st.o[1], pf[0][kk], desc_add(v_desc, kk * 16 * 128), true);
        }
    }
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
// probabilities as P·V's A operand: k-step kk is score columns 16kk .. 16kk + 15 (DSA rows: times
// each key's block scale, in fp32, then rounded once). No P·V may be in flight (it reads pf and
// writes O).
template <class C>
__device__ __forceinline__ void wg_rescale_and_pack(char* smem, WgConsumer<C>& st, int pos, const float (&s)[16],
                                                    const float (&alpha)[2], WgP<C>& pf) {
    if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int j = 0; j < C::WG_DV / 8; ++j) {
            st.o_at(4 * j) *= alpha[0]; st.o_at(4 * j + 1) *= alpha[0];
            st.o_at(4 * j + 2) *= alpha[1]; st.o_at(4 * j + 3) *= alpha[1];
        }
    }
    // s[8kk + 2k], s[8kk + 2k + 1]: keys 8i + 2t, 8i + 2t + 1 with i = 2kk + k / 2. DSA rows: the
    // keys' scales again from shared memory, as fold_blocks read them (registers are short)
    if constexpr (C::KV_SCALED) {
        const WgCoords w = WgCoords::of();
        const float* scales = stage_scales<C>(smem, pos % C::STAGES);
#pragma unroll
        for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int key = 8 * (2 * kk + k / 2) + 2 * w.t;
                const float2 k0 = key_scales<C>(scales, w.c, key), k1 = key_scales<C>(scales, w.c, key + 1);
                const float p0 = s[8 * kk + 2 * k], p1 = s[8 * kk + 2 * k + 1];
                pf[0][kk][k] = pack_bf16x2(p0 * k0.x, p1 * k1.x);
                pf[1][kk][k] = pack_bf16x2(p0 * k0.y, p1 * k1.y);
            }
    } else {
#pragma unroll
        for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
            for (int k = 0; k < 4; ++k) pf[0][kk][k] = pack_bf16x2(s[8 * kk + 2 * k], s[8 * kk + 2 * k + 1]);
    }
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
            wg_issue_pv<C>(st, d, pos - 1, pf);
            wg_issue_qk<C>(smem, st, d, pos, sc);
            scores(tile, sc, alpha);
        } else {
            wg_issue_qk<C>(smem, st, d, pos, sc);
            wg_issue_pv<C>(st, d, pos - 1, pf);
            wgmma_wait<1>();  // QK of this tile is done; P·V of the last one may run on
            scores(tile, sc, alpha);
            wgmma_wait<0>();
            wg_release(ring_empty<C>(smem, (pos - 1) % C::STAGES));
        }
        wg_rescale_and_pack<C>(smem, st, pos, sc.s, alpha, pf);
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
            *reinterpret_cast<float2*>(out + 8 * j) =
                make_float2(st.o_at(4 * j + 2 * h) * inv, st.o_at(4 * j + 2 * h + 1) * inv);
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
    constexpr bool PER_TENSOR = C::KV_FP8 && !C::KV_SCALED;
    char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);  // swizzled tiles need 1024-byte alignment
    if (threadIdx.x == 0) {
        // every producer thread's conversion (DSA rows: and its cp.async arrival); every consumer warp
        ring_init<C>(smem, C::KV_SCALED ? 2 * 128 : 128, C::CONSUMER_WARPS);
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
        if constexpr (PER_TENSOR) scale_log2 *= kv_scale;
        WgConsumer<C> st;
        wg_begin<C>(smem, st, q_rows, num_rows);
        wg_consume<C>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);
        const auto second = second_fn();
        if constexpr (is_key_range<decltype(second_fn())>)
            wg_consume<C>(smem, st, ring_pos, second.num_keys, second.visible, second.tile_begin, second.tile_end,
                          scale_log2);
        wg_end<C>(st, part_o, part_lse, PER_TENSOR ? kv_scale : 1.f);
    }
}

}  // namespace kgen
