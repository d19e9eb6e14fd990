// MLA attention of BM packed (token, head) query rows against a range of latent KV rows,
// producing a partial state: o (fp32, normalized) and its natural-log lse per row.
//
// Why this shape (sm_120: 99 KB of shared memory per block, mma.sync only):
// - All heads and tree tokens of a request share each latent row, so they are packed into the
//   MMA's M dimension: row r of a request is (token r / H, head r % H), and each staged KV row
//   serves all of them.
// - A 576-wide row is fat: 32 of them take 36 KB in bf16. The warps split the dims, not the rows:
//   warp group g (of 4) owns value dims [g*DV/4, (g+1)*DV/4), the latent part of the key, and a
//   share of the rope k-steps. It computes a partial score over its key dims, the 4 partials are
//   summed through shared memory, softmax runs once per row, and each group multiplies P by its
//   own value columns. Q fragments for the group's key dims stay in registers for the whole range.
// - One producer warp stages KV tiles into a STAGES-deep ring with bulk copies (one per row: no
//   per-thread address math or copy queue in the compute warps); "full" mbarriers count the bytes
//   in, "empty" mbarriers count the compute threads done with a stage. Rows are padded by 16 B so
//   ldmatrix row addresses fall in different banks.
// - The WARPS_M row blocks synchronize only among their own DIM_GROUPS warps (named barriers), so
//   one block's softmax overlaps another's MMAs on the same SM sub-partitions.
// - CLUSTER > 1: the CTAs of a cluster are the row tiles of one split (the schedule pads a request's
//   row tiles to whole clusters), so they read the same KV tiles. Each CTA's producer copies
//   1/CLUSTER of a tile's rows into every CTA's ring at once (multicast bulk copies: the tile
//   leaves L2 once, not once per row tile), every full barrier counts the whole tile, and a stage is
//   free once each compute warp of every CTA has arrived on its empty barrier in each CTA.
//
// KV in bf16: m16n8k16 bf16 MMAs. KV in fp8 e4m3 (value = byte * kv_scale) is staged as bytes
// (half the bf16 bytes) and multiplied in one of two precisions (the spec's cache.mma):
// - f16: each K/V fragment is converted to f16 (exact: e4m3 is a subset of f16) for m16n8k16 f16
//   MMAs; Q (scaled per row by a power of two, so exactly) and P are f16. Only the cache rounds.
// - e4m3: m16n8k32 e4m3 MMAs on the raw bytes, at twice the bf16 rate on sm_120. Q is quantized
//   once per row (its own scale: every row uses e4m3's range, none saturates) and P is stored as
//   e4m3(p * P_SCALE): both round to 3 mantissa bits (docs/fp8.md).
// The scales come back in fp32 in the softmax and in the final 1/l.
//
// KV in SGLang's DSA pool rows (KV_SCALED, cache.scales per_block: e4m3 latent | one fp32 scale per
// 128 latent dims | bf16 rope, 656 B for GLM-5): the latent bytes go through the fp8 path above
// with kv_scale 1 and the rope through bf16 MMAs (Q's rope scaled like the rest of Q: exact in f16
// mode). Warp group g's value dims are exactly scale block g, which places each per-key scale
// where it costs one fp32 multiply and adds no rounding:
// - Q·K: the group's latent k-steps accumulate <q, k_blk> of the raw bytes; the accumulator is
//   multiplied by each key's block-g scale before the rope steps add theirs (scale_block_scores),
//   and the 4 partials are summed as always.
// - P·V: the scale varies along P·V's k dimension (the keys), so it must enter an operand.
//   V's, in f16 mode where the plan says so (V_SCALED; kgen/designs/mma_sync.py scales_in_v):
//   each P·V warp multiplies its V fragments (group g's dims: block g) by their keys' scale over
//   the warp's reference R, a power of two at or above every block-g scale the warp has met, in
//   f16, rounded once (tile_v_scale): the products stay within e4m3's 448 and the large terms keep
//   f16's precision, P stays one copy, and the warp's O is held in units of R (rescaled when R
//   moves up; the final store multiplies R back). bench/NOTES.md v45.
//   Else P's (e4m3 mode, whose V bytes go to the MMA as they are, and the sm_120 plan, whose ptxas
//   spills the V path): the reducers fold the scale into P in fp32, one P per group:
//   p * scale_g / ref_g, rounded once to the MMA type just as p alone would be
//   (store_scaled_p). ref_g, per row, is a power of two at or above the largest p * scale_g the
//   row has met, kept like a second running max, so P stays <= 1 and keeps its precision whatever
//   the cache's magnitudes; the group's O is held in units of ref_g and rescaled with alpha when
//   ref_g moves, and the final 1/l carries ref_g.
#pragma once
#include "kgen/mma_fragments.cuh"

namespace kgen {

// Layout: the CTA's shared memory (bytes), rendered by kgen/designs/mma_sync.py (the planner's
// budget): the staged row strides KV_STRIDE / Q_STRIDE / P_STRIDE (bytes) and S_STRIDE
// (floats), the KV ring (RING_BYTES; Q is staged through it once, at Q_OFF = 0, unless Q_OFF places
// it apart, after the barriers: see copy_q), then S_OFF (partial scores
// [DIM_GROUPS][BM][S_STRIDE]), P_OFF (probabilities [P_COPIES][BM][P_STRIDE]), ALPHA_OFF and INV_L_OFF (a
// float per row, per copy), BAR_OFF (mbarriers full[STAGES], empty[STAGES], q), SMEM_BYTES, and SCRATCH_OFF:
// the schedule's scratch (the partial scores are free until the first tile).
template <int HEADS_, int D_, int DV_, int BM_, int BN_, int WARPS_M_, int DIM_GROUPS_, int STAGES_, bool KV_FP8_,
          bool MMA_E4M3_, bool KV_SCALED_, int CLUSTER_, class Layout>
struct AttnConfig : Layout {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = BM_, BN = BN_;
    static constexpr int WARPS_M = WARPS_M_, DIM_GROUPS = DIM_GROUPS_, STAGES = STAGES_;
    // CTAs of a cluster: the row tiles of one split, which share every KV tile (see the header).
    static constexpr int CLUSTER = CLUSTER_;
    static constexpr bool KV_FP8 = KV_FP8_;
    static constexpr bool MMA_E4M3 = MMA_E4M3_;           // fp8 KV: Q and P in e4m3 too
    static constexpr bool KV_SCALED = KV_SCALED_;         // fp8 KV in the DSA pool's rows (per-block scales)
    static constexpr bool MMA_F16 = KV_FP8 && !MMA_E4M3;  // fp8 KV converted to f16 in registers
    // scaled rows' block scales enter P·V through V (the plan's choice: kgen/designs/mma_sync.py scales_in_v)
    static constexpr bool V_SCALED = KV_SCALED && MMA_F16 && Layout::SCALES_IN_V;
    static constexpr int KV_ELEM = KV_FP8 ? 1 : 2;        // bytes per KV element
    static constexpr int P_ELEM = MMA_E4M3 ? 1 : 2;       // bytes per staged probability
    static constexpr int ROPE = D - DV;
    static constexpr int CONSUMERS = 32 * WARPS_M * DIM_GROUPS;  // threads that compute
    static constexpr int THREADS = CONSUMERS + 32;               // and one producer warp
    // Who frees a stage: every compute thread; in a cluster, each compute warp of every CTA.
    static constexpr int EMPTY_ARRIVALS = CLUSTER == 1 ? CONSUMERS : CONSUMERS / 32 * CLUSTER;
    static constexpr int SLICE = BN / CLUSTER;  // rows of a tile each CTA's producer copies
    // A slice of staged rows may be one tensor copy (whole_tiles_end): its destination 128-byte aligned,
    // a row's box of 8-byte elements at most 256 (kgen/designs/mma_sync.py tile_box: the same rule).
    static constexpr bool TILE_COPIES = (SLICE * Layout::KV_STRIDE) % 128 == 0 && Layout::KV_STRIDE % 16 == 0 &&
                                        Layout::KV_STRIDE / 8 <= 256;
    // The host's tensor map boxes one slice of staged rows.
    static constexpr bool tile_box_ok(int rows, int box_bytes, bool swizzled) {
        return TILE_COPIES && rows == SLICE && box_bytes == Layout::KV_STRIDE && !swizzled;
    }
    static constexpr int ROW_BLOCK_THREADS = 32 * DIM_GROUPS;    // the warps sharing a block of rows
    static constexpr int WARP_ROWS = BM / WARPS_M;
    static constexpr int M_TILES = WARP_ROWS / 16;
    static constexpr int DV_G = DV / DIM_GROUPS;  // value dims per group
    // One MMA k-step covers 32 bytes of its inputs: 16 bf16/f16 or 32 e4m3 dims. Each group takes
    // its value dims' steps and every DIM_GROUPS-th rope step.
    static constexpr int K_STEP = 32 / P_ELEM;
    // Keys per fragment load: ldmatrix moves 32 bytes of 16 keys for Q·K (16 bytes of 32 keys when
    // they are converted to f16), and 16 bf16 keys, or 32 fp8 keys as byte pairs, for P·V.
    static constexpr int K_BLOCK = MMA_F16 ? 32 : 16;
    static constexpr int V_BLOCK = KV_FP8 ? 32 : 16;
    static constexpr int VALUE_STEPS = DV_G / K_STEP;
    static constexpr int ROPE_K_STEP = KV_SCALED ? 16 : K_STEP;  // a scaled row's rope is bf16: k = 16 steps
    static constexpr int ROPE_STEPS = ROPE / ROPE_K_STEP;
    static constexpr int K_STEPS = VALUE_STEPS + (ROPE_STEPS + DIM_GROUPS - 1) / DIM_GROUPS;  // most per group
    static constexpr float P_SCALE = MMA_E4M3 ? 256.f : 1.f;  // p <= 1 is stored as p * P_SCALE
    // The online softmax's slack (rows.cuh): none for e4m3's p * P_SCALE nor for f16 P times the DSA
    // rows' block scales.
    static constexpr int MAX_SLACK = MMA_E4M3 || KV_SCALED ? 0 : BF16_P_SLACK;
    using Scaled = ScaledRow<D, DV>;  // a scaled row's layout (rows.cuh)
    static constexpr int SCALE_BLOCK = Scaled::SCALE_BLOCK, SCALE_OFF = Scaled::SCALE_OFF, ROPE_OFF = Scaled::ROPE_OFF;
    static constexpr int KV_ROW = KV_SCALED ? Scaled::BYTES : D * KV_ELEM;  // bytes per KV row
    static constexpr int Q_ROW = D * 2;                         // bytes per (bf16) query row
    // Scaled rows with the scales in P: each warp group has its own P (and rescale factors, and 1/l)
    // carrying its block's scales.
    static constexpr int P_COPIES = KV_SCALED && !V_SCALED ? DIM_GROUPS : 1;
    // Q's tile apart from the KV ring (Q_OFF > 0, where shared memory allows): its copies may start
    // before the ring is free, and the ring's before Q is in registers.
    static constexpr bool Q_APART = Layout::Q_OFF != 0;
    using Layout::BAR_OFF, Layout::KV_STRIDE, Layout::P_STRIDE, Layout::Q_STRIDE, Layout::RING_BYTES;
    // Softmax: each row's scores are reduced by RED_THREADS consecutive lanes.
    static constexpr int RED_THREADS = CONSUMERS / BM;
    static constexpr int RED_COLS = BN / RED_THREADS;
    // Named barriers: 0 is __syncthreads, CONSUMERS_BAR all compute warps, then one per row block.
    static constexpr int CONSUMERS_BAR = 1, ROW_BLOCK_BAR0 = 2;

    static_assert(M_TILES >= 1 && WARP_ROWS % 16 == 0, "each warp owns whole 16-row MMA tiles");
    static_assert(DV_G % K_STEP == 0 && ROPE % K_STEP == 0, "dims must be whole k-steps");
    static_assert(BN % K_BLOCK == 0 && BN % V_BLOCK == 0 && BN % K_STEP == 0 && BN <= 32, "tile shape: one producer lane per staged row");
    static_assert(KV_FP8 || !MMA_E4M3, "e4m3 MMAs need an e4m3 cache");
    static_assert(!V_SCALED || BN == 32, "scaled rows in f16 mode: a tile's key k is lane k (tile_v_scale)");
    static_assert(!KV_SCALED || (KV_FP8 && DV_G == SCALE_BLOCK && DIM_GROUPS == 4 && ROPE > 0 && ROPE % 16 == 0),
                  "scaled rows: each warp group's value dims are one scale block (read as a float4 of scales)");
    static_assert(KV_STRIDE >= KV_ROW && Q_STRIDE >= Q_ROW && P_STRIDE >= BN * P_ELEM, "staged rows fit their strides");
    static constexpr int BAR_END = BAR_OFF + (2 * STAGES + 1) * 8;  // mbarriers: full and empty per stage, q
    static_assert(STAGES * BN * KV_STRIDE <= RING_BYTES, "the stages fit the ring");
    static_assert(Q_APART ? Layout::Q_OFF >= BAR_END && Layout::Q_OFF + BM * Q_STRIDE <= Layout::SMEM_BYTES
                          : BM * Q_STRIDE <= RING_BYTES, "Q is staged through the KV ring, or after the barriers");
    static_assert(Layout::SMEM_BYTES >= BAR_END, "the barriers fit the layout");
    static_assert(CONSUMERS % BM == 0 && BN % RED_THREADS == 0 && RED_COLS % 2 == 0, "softmax layout");
    static_assert(RED_THREADS <= 32 && 32 % RED_THREADS == 0, "a row's reducers share a warp");
    static_assert(CLUSTER >= 1 && CLUSTER <= 8 && BN % CLUSTER == 0, "a cluster of at most 8 CTAs copies whole rows");
    static_assert(ROW_BLOCK_BAR0 + WARPS_M <= 16, "named barrier ids");
    static_assert(KV_ROW % 16 == 0 && KV_STRIDE % 16 == 0 && Q_STRIDE % 16 == 0 && Layout::Q_OFF % 16 == 0 && BAR_OFF % 8 == 0,
                  "bulk copies move 16-byte multiples between 16-byte aligned addresses");
};

template <class C>
__device__ __forceinline__ bool is_producer() { return threadIdx.x >= C::CONSUMERS; }

template <class C>
__device__ __forceinline__ mbarrier* q_full(char* smem) {
    return reinterpret_cast<mbarrier*>(smem + C::BAR_OFF) + 2 * C::STAGES;
}

// The staged Q tile: BM rows of Q_STRIDE bytes.
template <class C>
__device__ __forceinline__ char* q_tile(char* smem) { return smem + C::Q_OFF; }

// First key dim of this warp group's k-step `ks`: its value/latent slice, then its rope steps.
template <class C>
__device__ __forceinline__ int key_dim(int group, int ks) {
    return ks < C::VALUE_STEPS ? group * C::DV_G + ks * C::K_STEP
                               : C::DV + ((ks - C::VALUE_STEPS) * C::DIM_GROUPS + group) * C::ROPE_K_STEP;
}

// Byte of key dim d in a staged KV row (a scaled row keeps its bf16 rope after the block scales).
template <class C>
__device__ __forceinline__ int key_byte(int d) {
    return C::KV_SCALED && d >= C::DV ? C::ROPE_OFF + (d - C::DV) * 2 : d * C::KV_ELEM;
}

// Whether k-step ks is a scaled row's bf16 rope step (a bf16 MMA among the f16/e4m3 ones).
template <class C>
__device__ __forceinline__ bool bf16_rope_step(int ks) { return C::KV_SCALED && ks >= C::VALUE_STEPS; }

// Per-thread state of a CTA attending BM query rows: the warp's Q fragments (for its key dims),
// its O accumulator (for its value dims), and the online-softmax state of row red_row: the
// running max, kept identically by that row's RED_THREADS reducers, and each reducer's share of
// the running sum (summed over the reducers once, in attend_end).
template <class C>
struct AttnState {
    unsigned qf[C::M_TILES][C::K_STEPS][4];
    float o_acc[C::M_TILES][C::DV_G / 8][4];
    float row_max, row_sum;
    float score_scale;  // raw MMA score of row red_row -> log2-domain logit
    float out_scale;    // P·V accumulator -> value units, before 1/l
    unsigned block_ref;  // scaled rows, scales in P: row red_row's P reference per group, 2^(e - 127), byte g = e (store_scaled_p)
    int v_exp;           // scaled rows, scales in V: this warp's V reference R = 2^(v_exp - 127) (tile_v_scale)
    int ring_pos;       // KV tiles that have passed through the ring (all ranges so far)
};

struct WarpCoords {
    int lane, group, wrow0, g, q4, red_row, red_col0;
    template <class C>
    __device__ __forceinline__ static WarpCoords of() {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        return {lane,
                warp % C::DIM_GROUPS,                      // which dims this warp owns
                (warp / C::DIM_GROUPS) * C::WARP_ROWS,     // first query row of this warp
                lane / 4, lane % 4,                        // mma fragment coordinates
                static_cast<int>(threadIdx.x) / C::RED_THREADS,
                (static_cast<int>(threadIdx.x) % C::RED_THREADS) * C::RED_COLS};
    }
};

// A query value at its MMA's scale, from the row's q_div (load_q_fragments). f16: x times a power
// of two (exact). e4m3: x * 448 / max|q| with one rounding (x * 448 is exact for a bf16 x), so an
// exact tie, which bf16 values often make (8 significant bits), rounds to even as
// kgen.fp8.e4m3_rows rounds it; x * (1 / q_scale) rounds twice and broke such ties either way
// (bench/NOTES.md, "e4m3 tree").
template <class C>
__device__ __forceinline__ float q_at_scale(float x, float q_div) {
    if constexpr (C::MMA_E4M3) return __fdiv_rn(x * E4M3_MAX, q_div);
    else return x * q_div;
}

// Dims d .. d + 3 of a staged bf16 query row at its MMA's scale.
template <class C>
__device__ __forceinline__ float4 scaled4(const char* q_row, int d, float q_div) {
    const uint2 raw = *reinterpret_cast<const uint2*>(q_row + d * 2);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(q_at_scale<C>(a.x, q_div), q_at_scale<C>(a.y, q_div), q_at_scale<C>(b.x, q_div),
                       q_at_scale<C>(b.y, q_div));
}

// A fragment of k-step dims [d0, d0 + K_STEP) for rows r and r + 8 of the staged Q tile, scaled.
// e4m3 (k = 32): register i holds 4 consecutive dims. f16 (k = 16): the k order is permuted to
// match key_fragments' (lane q holds dims 4q .. 4q+3: k 2q, 2q+1 in a[0] and k 2q+8, 2q+9 in a[2]).
template <class C>
__device__ __forceinline__ void quantize_q(unsigned (&a)[4], const char* qt, int r, int d0, int q4,
                                           float div_lo, float div_hi) {
    const float4 lo = scaled4<C>(qt + r * C::Q_STRIDE, d0 + 4 * q4, div_lo);
    const float4 hi = scaled4<C>(qt + (r + 8) * C::Q_STRIDE, d0 + 4 * q4, div_hi);
    if constexpr (C::MMA_E4M3) {
        const float4 lo2 = scaled4<C>(qt + r * C::Q_STRIDE, d0 + 16 + 4 * q4, div_lo);
        const float4 hi2 = scaled4<C>(qt + (r + 8) * C::Q_STRIDE, d0 + 16 + 4 * q4, div_hi);
        a[0] = pack_e4m3x4(lo);
        a[1] = pack_e4m3x4(hi);
        a[2] = pack_e4m3x4(lo2);
        a[3] = pack_e4m3x4(hi2);
    } else {
        a[0] = pack_half2(lo.x, lo.y);
        a[1] = pack_half2(hi.x, hi.y);
        a[2] = pack_half2(lo.z, lo.w);
        a[3] = pack_half2(hi.z, hi.w);
    }
}

// Dims d, d + 1 of a staged bf16 query row at its MMA's scale, as bf16x2.
template <class C>
__device__ __forceinline__ unsigned scaled_bf16x2(const char* q_row, int d, float q_div) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(q_row + d * 2));
    return pack_bf16x2(q_at_scale<C>(v.x, q_div), q_at_scale<C>(v.y, q_div));
}

// A bf16 fragment (m16n8k16, the plain k order of key_fragments_b16) of dims [d0, d0 + 16) for rows
// r and r + 8 of the staged Q tile, scaled: a scaled row's rope k-steps.
template <class C>
__device__ __forceinline__ void scaled_q_bf16(unsigned (&a)[4], const char* qt, int r, int d0, int q4,
                                              float div_lo, float div_hi) {
    const char* lo = qt + r * C::Q_STRIDE;
    const char* hi = qt + (r + 8) * C::Q_STRIDE;
    a[0] = scaled_bf16x2<C>(lo, d0 + 2 * q4, div_lo);
    a[1] = scaled_bf16x2<C>(hi, d0 + 2 * q4, div_hi);
    a[2] = scaled_bf16x2<C>(lo, d0 + 8 + 2 * q4, div_lo);
    a[3] = scaled_bf16x2<C>(hi, d0 + 8 + 2 * q4, div_hi);
}

// Q fragments of this warp from the staged Q tile. bf16: ldmatrix. fp8 KV: each row is scaled by
// its own q_scale (its reducers find max|q| and keep q_scale in score_scale): e4m3 maps max|q| to
// 448 (no value saturates); f16 divides by a power of two that puts max|q| in [2^14, 2^15)
// (exact, far below f16's 65504).
template <class C>
__device__ __forceinline__ void load_q_fragments(char* smem, AttnState<C>& st, float scale_log2, float kv_scale) {
    const WarpCoords w = WarpCoords::of<C>();
    st.score_scale = scale_log2;
    st.out_scale = 1.f;
    if constexpr (!C::KV_FP8) {
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
            for (int ks = 0; ks < C::K_STEPS; ++ks) {
                const int r = w.wrow0 + mt * 16 + (w.lane % 16);
                ldmatrix_x4(st.qf[mt][ks], q_tile<C>(smem) + r * C::Q_STRIDE + key_dim<C>(w.group, ks) * 2 + (w.lane / 16) * 16);
            }
    } else {
        float* q_div = reinterpret_cast<float*>(smem + C::ALPHA_OFF);  // free until the first tile
        const char* my_row = q_tile<C>(smem) + w.red_row * C::Q_STRIDE;
        float amax = 0.f;
        for (int d = (threadIdx.x % C::RED_THREADS) * 8; d < C::D; d += C::RED_THREADS * 8) {
            float v[8];
            load8(v, reinterpret_cast<const bf16*>(my_row + d * 2));
#pragma unroll
            for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
        }
#pragma unroll
        for (int off = 1; off < C::RED_THREADS; off *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float q_scale = !(amax > 0.f) ? 1.f : C::MMA_E4M3 ? amax / E4M3_MAX : ldexpf(1.f, ilogbf(amax) - 14);
        st.score_scale = scale_log2 * kv_scale * q_scale;
        st.out_scale = kv_scale / C::P_SCALE;
        if (threadIdx.x % C::RED_THREADS == 0)  // what q_at_scale takes: e4m3 divides by max|q|, f16 multiplies
            q_div[w.red_row] = C::MMA_E4M3 ? (amax > 0.f ? amax : E4M3_MAX) : 1.f / q_scale;
        named_barrier(C::CONSUMERS_BAR, C::CONSUMERS);
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt) {
            const int r = w.wrow0 + mt * 16 + w.g;
            const float div_lo = q_div[r], div_hi = q_div[r + 8];
#pragma unroll
            for (int ks = 0; ks < C::K_STEPS; ++ks) {
                if (!has_step<C>(w.group, ks)) continue;
                if (bf16_rope_step<C>(ks)) scaled_q_bf16<C>(st.qf[mt][ks], q_tile<C>(smem), r, key_dim<C>(w.group, ks), w.q4, div_lo, div_hi);
                else quantize_q<C>(st.qf[mt][ks], q_tile<C>(smem), r, key_dim<C>(w.group, ks), w.q4, div_lo, div_hi);
            }
        }
    }
}

// Start the copies of Q's real rows (min(num_rows, BM)) into the Q tile: the producer warp's bulk
// copies, counted on q_full, which its lane 0 sets up. The compute warps wait on q_full after a sync.
template <class C, class QRows>
__device__ __forceinline__ void copy_q(char* smem, const QRows& q_rows, int num_rows) {
    if (!is_producer<C>()) return;
    const int rows = min(num_rows, C::BM), lane = threadIdx.x % 32;
    if (lane == 0) {
        mbar_init(q_full<C>(smem), 1);
        mbar_init_fence();
        mbar_arrive_expect_tx(q_full<C>(smem), rows * C::Q_ROW);
    }
    __syncwarp();
    for (int r = lane; r < rows; r += 32) bulk_copy(q_tile<C>(smem) + r * C::Q_STRIDE, q_rows.row(r, 0), C::Q_ROW, q_full<C>(smem));
}

// What attend() takes for its Q rows when the caller has started their copies (copy_q) already.
struct StagedQ {};
template <class C>
__device__ __forceinline__ void copy_q(char*, const StagedQ&, int) {}

// Set up the ring's barriers, load Q into fragments (copied here, or already by the caller:
// StagedQ), zero O.
// scale_log2: softmax scale * log2(e); kv_scale: the e4m3 KV's dequantization scale (unused for bf16).
template <class C, class QRows>
__device__ __forceinline__ void attend_begin(char* smem, AttnState<C>& st, const QRows& q_rows, int num_rows,
                                             float scale_log2, float kv_scale) {
    // Q's padding rows are zeros written here, not copies of the last row: a decode tile (8 of 32
    // rows) waited on 24 more bulk copies of one row (bench/NOTES.md v48). Through the ring, the
    // ring's copies overwrite them later: the async proxy must see these generic writes first.
    const int rows = min(num_rows, C::BM);
    constexpr int CHUNKS = C::Q_ROW / 16;
    for (int i = threadIdx.x; i < (C::BM - rows) * CHUNKS; i += blockDim.x)
        *reinterpret_cast<uint4*>(q_tile<C>(smem) + (rows + i / CHUNKS) * C::Q_STRIDE + (i % CHUNKS) * 16) = make_uint4(0, 0, 0, 0);
    if constexpr (!C::Q_APART) fence_proxy_async();
    copy_q<C>(smem, q_rows, num_rows);
    if (threadIdx.x == 0) {
        ring_init<C>(smem, 1, C::EMPTY_ARRIVALS);  // the producer lane 0's expect_tx; the compute threads
        mbar_init_fence();
    }
    __syncthreads();
    st.ring_pos = 0;
    if (!is_producer<C>()) {
        mbar_wait(q_full<C>(smem), 0);
        load_q_fragments<C>(smem, st, scale_log2, kv_scale);
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
            for (int n = 0; n < C::DV_G / 8; ++n)
#pragma unroll
                for (int k = 0; k < 4; ++k) st.o_acc[mt][n][k] = 0.f;
        st.row_max = neg_inf();
        st.row_sum = 0.f;
        st.block_ref = 0x01010101u;  // 2^-126 each: no scale seen yet
        st.v_exp = 1;
    }
    // Through the ring, Q must be in registers before the ring is refilled (in a cluster, by any CTA's
    // producer, once every CTA has its Q: the sync also makes the barriers set up above visible to the
    // peers); apart from it, the producer stages the first tiles while the compute warps load Q.
    if constexpr (C::CLUSTER > 1) cluster_sync();
    else if constexpr (!C::Q_APART) __syncthreads();
}

// B operands of S = Q·K^T for the k-step at byte k_byte of the K_BLOCK keys from key0: kb[n] for
// keys key0 + [8n, 8n + 8).
template <class C>
__device__ __forceinline__ void key_fragments(unsigned (&kb)[C::K_BLOCK / 8][2], const char* kt, int key0, int k_byte,
                                              int lane) {
    if constexpr (C::MMA_F16) f16_key_fragments<C>(kb, kt, key0, k_byte, lane);
    else key_fragments_32b<C>(kb, kt, key0, k_byte, lane);
}

// Scaled rows: this group's latent k-steps (scale block `group`) summed <q, raw bytes> per key; times
// each key's block scale that is the latent's score in value units (before the rope steps add theirs).
template <class C>
__device__ __forceinline__ void scale_block_scores(float (&s_acc)[C::M_TILES][C::BN / 8][4], const char* kt, int group,
                                                   int q4) {
#pragma unroll
    for (int n = 0; n < C::BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // this lane's keys n*8 + 2*q4 + e, in rows g (k = e) and g + 8 (k = 2 + e)
            const float scale =
                *reinterpret_cast<const float*>(kt + (n * 8 + 2 * q4 + e) * C::KV_STRIDE + C::SCALE_OFF + 4 * group);
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; ++mt) {
                s_acc[mt][n][e] *= scale;
                s_acc[mt][n][2 + e] *= scale;
            }
        }
}

// A scaled-row group's P reference for this reducer's row: a power of two, kept as its biased
// exponent (one byte per group: the four take one register through the loop).
template <class C>
__device__ __forceinline__ float block_ref(const AttnState<C>& st, int group) {
    return __int_as_float(((st.block_ref >> (8 * group)) & 0xffu) << 23);
}

// The biased exponent of the smallest power of two >= x >= 0, within the normal range.
__device__ __forceinline__ int pow2_exp_above(float x) {
    const int bits = __float_as_int(x);
    return min(max(((bits >> 23) & 0xff) + ((bits & 0x7fffff) != 0), 1), 254);
}

// Scaled rows: the reducer of row `row` stores its probabilities once per warp group, each p times
// its key's block scale over the row's reference for that group, and the groups' rescale factors.
// The reference is a power of two at or above the largest p * scale the row has met (in the units
// of its running max, so it follows alpha down), so the stored P is <= 1 and the terms that carry
// the output keep the MMA type's full precision, whatever the cache's magnitudes; O, held in units
// of it, is rescaled by the factor stored here when it moves (a row whose maximum has settled and
// meets no larger term moves nothing).
template <class C>
__device__ __forceinline__ void store_scaled_p(AttnState<C>& st, const char* kt, char* p_smem, float* alpha_smem,
                                               int row, int col0, const float (&p)[C::RED_COLS], float alpha) {
    const char* scales = kt + col0 * C::KV_STRIDE + C::SCALE_OFF;  // of this reducer's first key
    float top[4] = {0.f, 0.f, 0.f, 0.f};  // the largest p * block scale of this reducer's keys
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c) {
        const float4 sc = *reinterpret_cast<const float4*>(scales + c * C::KV_STRIDE);
        top[0] = fmaxf(top[0], p[c] * sc.x); top[1] = fmaxf(top[1], p[c] * sc.y);
        top[2] = fmaxf(top[2], p[c] * sc.z); top[3] = fmaxf(top[3], p[c] * sc.w);
    }
    bool moves = alpha != 1.f;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) moves |= top[gi] > block_ref(st, gi);
    const bool any_moves = __any_sync(0xffffffffu, moves);  // warp-uniform
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
        float factor = alpha;
        if (any_moves) {
#pragma unroll
            for (int off = 1; off < C::RED_THREADS; off *= 2)  // the row's reducers agree
                top[gi] = fmaxf(top[gi], __shfl_xor_sync(0xffffffffu, top[gi], off));
            const int old_exp = (st.block_ref >> (8 * gi)) & 0xff;
            const int new_exp = pow2_exp_above(fmaxf(top[gi], block_ref(st, gi) * alpha));
            factor = ldexpf(alpha, old_exp - new_exp);  // alpha * old / new <= 1
            st.block_ref = (st.block_ref & ~(0xffu << (8 * gi))) | (unsigned(new_exp) << (8 * gi));
        }
        const float inv_ref = __int_as_float((254 - int((st.block_ref >> (8 * gi)) & 0xff)) << 23);  // exact
        char* p_row = p_smem + (gi * C::BM + row) * C::P_STRIDE;
#pragma unroll
        for (int c = 0; c < C::RED_COLS; c += 2) {  // the scales again from shared memory: registers are short
            const float s0 = lds_f32(scales + c * C::KV_STRIDE + 4 * gi);
            const float s1 = lds_f32(scales + (c + 1) * C::KV_STRIDE + 4 * gi);
            store_p2<C>(p_row, col0 + c, p[c] * s0 * inv_ref, p[c + 1] * s1 * inv_ref);
        }
        if (threadIdx.x % C::RED_THREADS == 0) alpha_smem[gi * C::BM + row] = factor;
    }
}

// Scaled rows in f16 mode: this warp's V operand scale for staged tile kt, lane k's for key k (its
// block-`group` scale over the warp's reference R, as scaled_value_fragments takes it). R is a power
// of two at or above the largest scale the warp has met, so |scale / R| <= 1; when a tile brings a
// larger one R moves up, and `factor` (old R / new R, else 1) rescales the warp's O, which is held
// in units of R.
template <class C>
__device__ __forceinline__ float tile_v_scale(AttnState<C>& st, const char* kt, const WarpCoords& w, float& factor) {
    const float scale = lds_f32(kt + w.lane * C::KV_STRIDE + C::SCALE_OFF + 4 * w.group);
    // the largest magnitude of the tile's scales: the bits of |x| order as the values
    const unsigned top = __reduce_max_sync(0xffffffffu, __float_as_uint(scale) & 0x7fffffffu);
    const int e = pow2_exp_above(__uint_as_float(top));
    factor = 1.f;
    if (e > st.v_exp) {  // warp-uniform
        factor = __int_as_float(max(127 + st.v_exp - e, 0) << 23);  // 2^(old - new), exact (or 0 below 2^-126)
        st.v_exp = e;
    }
    return scale * __int_as_float((254 - st.v_exp) << 23);  // scale / R: 1 / R is exact
}

// o_acc += P · V for this warp's rows and value dims over one staged tile (scaled rows in f16 mode:
// V times its keys' v_ratio, tile_v_scale's).
template <class C>
__device__ __forceinline__ void pv_tile(AttnState<C>& st, const char* p_smem, const char* kt, const WarpCoords& w,
                                        float v_ratio) {
    constexpr int STEPS = C::V_BLOCK / C::K_STEP;  // MMA k-steps per key block
    const int lane = w.lane;
#pragma unroll
    for (int key0 = 0; key0 < C::BN; key0 += C::V_BLOCK) {
        unsigned pf[C::M_TILES][STEPS][4];
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
                ldmatrix_x4(pf[mt][s], p_smem + (w.wrow0 + mt * 16 + (lane % 16)) * C::P_STRIDE +
                                           (key0 / C::K_STEP + s) * 32 + (lane / 16) * 16);
#pragma unroll
        for (int np = 0; np < C::DV_G / 16; ++np) {
            unsigned vb[STEPS][2][2];
            if constexpr (C::V_SCALED) scaled_value_fragments<C>(vb, kt, key0, w.group * C::DV_G + np * 16, lane, v_ratio);
            else value_fragments<C>(vb, kt, key0, w.group * C::DV_G + np * 16, lane);
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
                for (int s = 0; s < STEPS; ++s) {
                    mma<C>(st.o_acc[mt][2 * np], pf[mt][s], vb[s][0][0], vb[s][0][1]);
                    mma<C>(st.o_acc[mt][2 * np + 1], pf[mt][s], vb[s][1][0], vb[s][1][1]);
                }
        }
    }
}

// Producer: stage key rows [tile*BN, tile*BN + BN) of each tile of [tile_begin, tile_end) into
// the ring, one bulk copy per row (lane), as soon as the compute warps free a stage. A tile of
// consecutive slots (whole_tiles_end) is one tensor copy of each CTA's slice instead: the copy
// engine takes one request for what 32 row copies asked (bench/NOTES.md v40).
template <class C, class Keys>
__device__ __forceinline__ void stage_range(char* smem, AttnState<C>& st, const Keys& keys, int num_keys,
                                            int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;  // (an empty range may have no keys to fetch)
    const int lane = threadIdx.x % 32;
    const int whole_end = whole_tiles_end<C::BN>(keys, num_keys, tile_begin, tile_end);
    PendingRow next = fetch_row<C::BN>(tile_begin, lane, num_keys, keys);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++st.ring_pos) {
        const PendingRow row = next;
        if (tile + 1 < tile_end) next = fetch_row<C::BN>(tile + 1, lane, num_keys, keys);
        const int stage = ring_wait_free<C>(smem, st.ring_pos);
        if constexpr (tiles_in_pages<Keys, C::BN> && C::TILE_COPIES) {
            if (tile < whole_end) {
                if (lane == 0) mbar_arrive_expect_tx(ring_full<C>(smem, stage), C::BN * C::KV_STRIDE);
                __syncwarp();
                const int rank = C::CLUSTER > 1 ? (int)cluster_rank() : 0;
                if (lane == rank * C::SLICE) {  // the first row of this CTA's slice: its slot starts the box
                    char* slice = smem + (stage * C::BN + lane) * C::KV_STRIDE;
                    const int y = (int)keys.slot(row.j, row.fetched);
                    if constexpr (C::CLUSTER > 1)
                        tile_copy_multicast(slice, keys.tile_map, 0, y, ring_full<C>(smem, stage), (1u << C::CLUSTER) - 1);
                    else
                        tile_copy(slice, keys.tile_map, 0, y, ring_full<C>(smem, stage));
                }
                continue;
            }
        }
        if (lane == 0) mbar_arrive_expect_tx(ring_full<C>(smem, stage), C::BN * C::KV_ROW);
        __syncwarp();
        char* dst = smem + (stage * C::BN + lane) * C::KV_STRIDE;
        if constexpr (C::CLUSTER > 1) {
            if (lane / C::SLICE == (int)cluster_rank())  // this CTA's slice, into every CTA's ring
                bulk_copy_multicast(dst, keys.row(row.j, row.fetched), C::KV_ROW, ring_full<C>(smem, stage),
                                    (1u << C::CLUSTER) - 1);
        } else if (lane < C::BN) {
            bulk_copy(dst, keys.row(row.j, row.fetched), C::KV_ROW, ring_full<C>(smem, stage));
        }
    }
}

// 1. This warp's partial scores over its group's key dims of staged tile `kt`, into s_part
// [group][row][key] for the row block's reducers.
template <class C>
__device__ __forceinline__ void partial_scores(const AttnState<C>& st, const char* kt, float* s_part,
                                               const WarpCoords& w) {
    float s_acc[C::M_TILES][C::BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
        for (int n = 0; n < C::BN / 8; ++n)
#pragma unroll
            for (int k = 0; k < 4; ++k) s_acc[mt][n][k] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::K_STEPS; ++ks) {
        if (C::KV_SCALED && ks == C::VALUE_STEPS) scale_block_scores<C>(s_acc, kt, w.group, w.q4);
        if (!has_step<C>(w.group, ks)) continue;  // warp-uniform
        if (bf16_rope_step<C>(ks)) {
#pragma unroll
            for (int key0 = 0; key0 < C::BN; key0 += 16) {
                unsigned kb[2][2];
                key_fragments_32b<C>(kb, kt, key0, key_byte<C>(key_dim<C>(w.group, ks)), w.lane);
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
                    for (int n = 0; n < 2; ++n) mma_16816(s_acc[mt][key0 / 8 + n], st.qf[mt][ks], kb[n][0], kb[n][1]);
            }
            continue;
        }
#pragma unroll
        for (int key0 = 0; key0 < C::BN; key0 += C::K_BLOCK) {
            unsigned kb[C::K_BLOCK / 8][2];
            key_fragments<C>(kb, kt, key0, key_byte<C>(key_dim<C>(w.group, ks)), w.lane);
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
                for (int n = 0; n < C::K_BLOCK / 8; ++n)
                    mma<C>(s_acc[mt][key0 / 8 + n], st.qf[mt][ks], kb[n][0], kb[n][1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
        for (int n = 0; n < C::BN / 8; ++n) {
            const float* a = s_acc[mt][n];
            const int r = w.wrow0 + mt * 16 + w.g, c = n * 8 + 2 * w.q4;
            float* dst = s_part + (w.group * C::BM + r) * C::S_STRIDE + c;
            *reinterpret_cast<float2*>(dst) = make_float2(a[0], a[1]);
            *reinterpret_cast<float2*>(dst + 8 * C::S_STRIDE) = make_float2(a[2], a[3]);
        }
}

// Which of its RED_COLS keys of tile `tile` row red_row sees: (c, key) -> bool, c the column
// among them, key = tile * BN + red_col0 + c < num_keys. This generic one asks the visibility per
// key; a visibility whose answers come from memory overloads tile_visibility to load them when
// the tile starts, so the loads overlap the tile's partial scores (ListVisible).
template <class Visible>
struct RowVisibility {
    const Visible& visible;
    int row;
    __device__ __forceinline__ bool operator()(int, int key) const { return visible(row, key); }
};
template <class C, class Visible>
__device__ __forceinline__ RowVisibility<Visible> tile_visibility(const Visible& visible, int, int,
                                                                  const WarpCoords& w) {
    return {visible, w.red_row};
}

// 2. Row red_row's share of key tile `tile` (softmax_row): its probabilities into P and the row's
// rescale factor alpha. `visible` is the tile's tile_visibility.
template <class C, class TileVisible>
__device__ __forceinline__ void softmax_tile(char* smem, AttnState<C>& st, const char* kt, int tile, int num_keys,
                                             const TileVisible& visible, const WarpCoords& w) {
    float p[C::RED_COLS];
    const SoftmaxStep step = softmax_row<C>(smem, st, tile, num_keys, visible, w.red_row, w.red_col0, p);
    if constexpr (C::KV_SCALED && !C::V_SCALED) {
        store_scaled_p<C>(st, kt, smem + C::P_OFF, reinterpret_cast<float*>(smem + C::ALPHA_OFF), w.red_row,
                          w.red_col0, p, step.alpha);
    } else {
        store_p_row<C>(smem, w.red_row, w.red_col0, p, step.alpha);
    }
}

// 3. Rescale this warp's output rows by their alpha and add P·V for its value columns. Once the
// running maxima settle (most tiles of a long prefix) alpha is 1 and the rescale is skipped.
template <class C>
__device__ __forceinline__ void rescale_and_pv(char* smem, AttnState<C>& st, const char* kt, const WarpCoords& w) {
    // The probabilities and rescale factors this warp multiplies its values by (scaled rows, scales in P: its group's).
    const int copy = C::P_COPIES > 1 ? w.group : 0;
    const float* alpha_smem = reinterpret_cast<const float*>(smem + C::ALPHA_OFF) + copy * C::BM;
    float v_factor = 1.f, v_ratio = 0.f;  // scaled rows, scales in V: O's move to a larger V reference, V's scale
    if constexpr (C::V_SCALED) v_ratio = tile_v_scale<C>(st, kt, w, v_factor);
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt) {
        const float a_lo = alpha_smem[w.wrow0 + mt * 16 + w.g] * v_factor;
        const float a_hi = alpha_smem[w.wrow0 + mt * 16 + w.g + 8] * v_factor;
        if (__all_sync(0xffffffffu, a_lo == 1.f && a_hi == 1.f)) continue;
#pragma unroll
        for (int n = 0; n < C::DV_G / 8; ++n) {
            st.o_acc[mt][n][0] *= a_lo; st.o_acc[mt][n][1] *= a_lo;
            st.o_acc[mt][n][2] *= a_hi; st.o_acc[mt][n][3] *= a_hi;
        }
    }
    pv_tile<C>(st, smem + C::P_OFF + copy * C::BM * C::P_STRIDE, kt, w, v_ratio);
}

// Compute warps: attend over the staged tiles, continuing the online softmax in `st`. Per tile:
// partial scores, then (the row block's warps in step) softmax, then P·V.
template <class C, class Visible>
__device__ __forceinline__ void consume_range(char* smem, AttnState<C>& st, int num_keys, Visible visible,
                                              int tile_begin, int tile_end) {
    float* s_part = reinterpret_cast<float*>(smem + C::S_OFF);
    const WarpCoords w = WarpCoords::of<C>();
    // This warp's row block: the DIM_GROUPS warps whose partial scores and probabilities it shares.
    const int block_bar = C::ROW_BLOCK_BAR0 + w.wrow0 / C::WARP_ROWS;

    for (int tile = tile_begin; tile < tile_end; ++tile, ++st.ring_pos) {
        const auto tile_visible = tile_visibility<C>(visible, tile, num_keys, w);
        const int stage = ring_wait_full<C>(smem, st.ring_pos);
        const char* kt = smem + stage * C::BN * C::KV_STRIDE;
        partial_scores<C>(st, kt, s_part, w);
        named_barrier(block_bar, C::ROW_BLOCK_THREADS);
        softmax_tile<C>(smem, st, kt, tile, num_keys, tile_visible, w);
        named_barrier(block_bar, C::ROW_BLOCK_THREADS);
        rescale_and_pv<C>(smem, st, kt, w);
        if constexpr (C::CLUSTER > 1) {  // this warp is done with the stage: lane r tells CTA r
            __syncwarp();
            if (w.lane < C::CLUSTER) mbar_arrive_cluster(ring_empty<C>(smem, stage), w.lane);
        } else {
            mbar_arrive(ring_empty<C>(smem, stage));  // this thread is done with the stage
        }
    }
}

// Attend over key rows [tile_begin*BN, tile_end*BN) of a range of num_keys keys, continuing the
// online softmax in `st` (so several ranges — a prefix split, then the tree — form one state).
// Every thread of the CTA calls it: the producer warp stages the tiles, the others consume them.
//   keys:          row source of the key/value rows of the range (rows < num_keys)
//   visible(r, t): whether query row r sees key t < num_keys
template <class C, class Keys, class Visible>
__device__ __forceinline__ void attend_range(char* smem, AttnState<C>& st, const Keys& keys, int num_keys,
                                             Visible visible, int tile_begin, int tile_end) {
    if (is_producer<C>()) stage_range<C>(smem, st, keys, num_keys, tile_begin, tile_end);
    else consume_range<C>(smem, st, num_keys, visible, tile_begin, tile_end);
}

// Normalize and write the partial state: part_o[BM][DV] (fp32, or bf16: PartO) and part_lse[BM]
// (natural log; -inf for rows that saw nothing).
template <class C, class PartO>
__device__ __forceinline__ void attend_end(char* smem, const AttnState<C>& st, PartO* __restrict__ part_o,
                                           float* __restrict__ part_lse) {
    if (is_producer<C>()) return;  // its last copies were consumed: nothing of it is pending
    float* inv_l_smem = reinterpret_cast<float*>(smem + C::INV_L_OFF);
    const WarpCoords w = WarpCoords::of<C>();
    float row_sum = st.row_sum;
#pragma unroll
    for (int off = 1; off < C::RED_THREADS; off *= 2) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
    if (threadIdx.x % C::RED_THREADS == 0) {
#pragma unroll
        for (int gi = 0; gi < C::P_COPIES; ++gi)  // scaled rows, scales in P: group gi's O is in units of its reference
            // (kv_scale is 1 for scaled rows, so their out_scale is 1 / P_SCALE: no register for it through the loop)
            inv_l_smem[gi * C::BM + w.red_row] =
                row_inv_l(row_sum, C::KV_SCALED ? (C::V_SCALED ? 1.f : block_ref(st, gi)) / C::P_SCALE : st.out_scale);
        part_lse[w.red_row] = row_lse(st.row_max, row_sum);
    }
    named_barrier(C::CONSUMERS_BAR, C::CONSUMERS);
    const float* my_inv_l = inv_l_smem + (C::P_COPIES > 1 ? w.group : 0) * C::BM;
    const float v_ref = C::V_SCALED ? __int_as_float(st.v_exp << 23) : 1.f;  // scaled rows, scales in V: O is in units of R
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt) {
        const int r = w.wrow0 + mt * 16 + w.g;
        const float il_lo = my_inv_l[r] * v_ref, il_hi = my_inv_l[r + 8] * v_ref;
        PartO* lo = part_o + r * C::DV;
        PartO* hi = part_o + (r + 8) * C::DV;
#pragma unroll
        for (int np = 0; np < C::DV_G / 16; ++np) {
            const float* e = st.o_acc[mt][2 * np];
            const float* o = st.o_acc[mt][2 * np + 1];
            const int d = w.group * C::DV_G + np * 16;
            if constexpr (C::KV_FP8) {  // even/odd dim tiles (value_fragments): this lane holds dims d + 4q .. +3
                store4(lo + d + 4 * w.q4, e[0] * il_lo, o[0] * il_lo, e[1] * il_lo, o[1] * il_lo);
                store4(hi + d + 4 * w.q4, e[2] * il_hi, o[2] * il_hi, e[3] * il_hi, o[3] * il_hi);
            } else {  // two 8-dim tiles: this lane holds dims d + 2q, +1 and d + 8 + 2q, +1
                store2(lo + d + 2 * w.q4, e[0] * il_lo, e[1] * il_lo);
                store2(hi + d + 2 * w.q4, e[2] * il_hi, e[3] * il_hi);
                store2(lo + d + 8 + 2 * w.q4, o[0] * il_lo, o[1] * il_lo);
                store2(hi + d + 8 + 2 * w.q4, o[2] * il_hi, o[3] * il_hi);
            }
        }
    }
}

// Attention of the CTA's BM query rows over the key range `first`, then the range second() returns
// (NoKeys: none; made once the first is done), one online softmax; writes the partial state to
// part_o / part_lse. Every thread calls it.
template <class C, class QRows, class First, class SecondFn, class PartO>
__device__ __forceinline__ void attend(char* smem, const QRows& q_rows, int num_rows, float scale_log2, float kv_scale,
                                       const First& first, const SecondFn& second_fn, PartO* __restrict__ part_o,
                                       float* __restrict__ part_lse) {
    AttnState<C> st;
    attend_begin<C>(smem, st, q_rows, num_rows, scale_log2, kv_scale);
    attend_range<C>(smem, st, first.keys, first.num_keys, first.visible, first.tile_begin, first.tile_end);
    const auto second = second_fn();
    if constexpr (is_key_range<decltype(second_fn())>)
        attend_range<C>(smem, st, second.keys, second.num_keys, second.visible, second.tile_begin, second.tile_end);
    attend_end<C>(smem, st, part_o, part_lse);
    if constexpr (C::CLUSTER > 1) cluster_sync();  // no CTA exits while peers may still arrive on its barriers
}

}  // namespace kgen
