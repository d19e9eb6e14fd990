// The second mma.sync loop design (sm_120): every warp owns all BM = 32 query rows, so each K and
// V fragment is read from shared memory once per CTA instead of once per row block, and Q·K of
// the next tile may be issued before this tile's score exchange, so the tensor pipe has work while
// the softmax runs. Same partial state (o, lse) and kernels (attention_kernels.cuh) as attention.cuh;
// the fragment, softmax and store pieces both use are in mma_rows.cuh.
//
// - 8 compute warps, no producer warp (8 warps leave 255 registers a thread; 9 would cap them at
//   168). Q·K: warp w takes dim group w % 4 (its 128 latent dims and one rope k-step, as in
//   attention.cuh) and key half w / 4 of the tile; its Q fragments (2 x 9 k-steps, 72 registers)
//   stay in registers for the whole range. The 4 partial scores of each (row, key) are summed
//   through shared memory and the softmax runs once per row (8 reducers a row).
// - P·V: warp w owns value dims [64w, 64w + 64) of all 32 rows (64 accumulator registers).
// - The ring: "full" mbarriers count each stage's bytes in, one arrival per warp. Every warp stages
//   BN / 8 rows of each tile (one bulk copy per row), from page ids it fetched a tile earlier: a
//   stage is refilled with tile t - 1 + STAGES right after the first barrier of tile t, when every
//   warp is done with tile t - 1. (Refilled by one warp, 32 copies and a page-id load sat on the
//   critical path of every tile: v15 run 2.)
// - AHEAD: the partial scores of tile t are stored, then Q·K of tile t + 1 is issued and runs on
//   the tensor pipe under the exchange and softmax of tile t; P·V of tile t follows. It needs a
//   third stage to give the copies of tile t + STAGES a tile of lead (BN = 16, 4 stages in 99 KB).
//
// bf16 KV only (the planner keeps fp8 specs on attention.cuh).
#pragma once
#include "kgen/mma_rows.cuh"

namespace kgen {

// Layout: the CTA's shared memory (bytes), rendered by kgen/designs/overlap.py (the planner's
// budget): row strides KV_STRIDE / Q_STRIDE / P_STRIDE (bytes) and S_STRIDE (floats), the KV ring
// (RING_BYTES; Q is staged through it once), S_OFF (partial scores [4][BM][S_STRIDE]), P_OFF
// (probabilities [BM][P_STRIDE]), ALPHA_OFF and INV_L_OFF (a float per row), BAR_OFF (mbarriers
// full[STAGES], q), SMEM_BYTES, and SCRATCH_OFF (the schedule's, in the partial scores).
template <int HEADS_, int D_, int DV_, int BN_, int STAGES_, bool AHEAD_, class Layout>
struct OverlapAttnConfig : Layout {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = 32, BN = BN_, STAGES = STAGES_;
    static constexpr int CLUSTER = 1;  // CTAs a cluster: none
    static constexpr bool AHEAD = AHEAD_;
    // The helpers of mma_rows.cuh read these: bf16 in, bf16 MMAs.
    static constexpr bool KV_FP8 = false, MMA_E4M3 = false, MMA_F16 = false;
    static constexpr int KV_ELEM = 2, P_ELEM = 2, K_STEP = 16, K_BLOCK = 16, V_BLOCK = 16;
    static constexpr float P_SCALE = 1.f;
    static constexpr int MAX_SLACK = BF16_P_SLACK;  // the online softmax's slack (rows.cuh)
    static constexpr int ROPE = D - DV;
    static constexpr int DIM_GROUPS = 4, KEY_SPLITS = 2, WARPS = DIM_GROUPS * KEY_SPLITS;
    static constexpr int THREADS = 32 * WARPS, CONSUMERS = THREADS;
    static constexpr int M_TILES = BM / 16;
    static constexpr int WARP_KEYS = BN / KEY_SPLITS;  // keys of a warp's partial scores
    static constexpr int WARP_ROWS = BN / WARPS;       // rows of a tile each warp stages
    static constexpr int DV_G = DV / DIM_GROUPS;       // latent key dims of a dim group (key_dim)
    static constexpr int DV_W = DV / WARPS;            // value dims of a warp in P·V
    static constexpr int VALUE_STEPS = DV_G / K_STEP;
    static constexpr int ROPE_STEPS = ROPE / K_STEP;
    static constexpr int K_STEPS = VALUE_STEPS + (ROPE_STEPS + DIM_GROUPS - 1) / DIM_GROUPS;
    static constexpr int KV_ROW = D * KV_ELEM, Q_ROW = D * 2;
    using Layout::BAR_OFF, Layout::KV_STRIDE, Layout::P_STRIDE, Layout::Q_STRIDE, Layout::RING_BYTES;
    static constexpr int RED_THREADS = THREADS / BM;  // a row's reducers, consecutive lanes
    static constexpr int RED_COLS = BN / RED_THREADS;

    static_assert(ROPE_STEPS <= DIM_GROUPS && DV % (WARPS * 16) == 0 && DV_G % K_STEP == 0, "dims per warp");
    static_assert((BN == 16 || BN == 32) && RED_COLS % 2 == 0 && BN % WARPS == 0, "tile shape: 8 or 16 keys a warp");
    static_assert(KV_STRIDE >= KV_ROW && Q_STRIDE >= Q_ROW && P_STRIDE >= BN * P_ELEM, "staged rows fit their strides");
    static_assert(BM * Q_STRIDE <= RING_BYTES && STAGES * BN * KV_STRIDE <= RING_BYTES, "Q is staged through the KV ring");
    static_assert(Layout::SMEM_BYTES >= BAR_OFF + (STAGES + 1) * 8 && BAR_OFF % 8 == 0, "the barriers fit the layout");
    static_assert(STAGES >= 2 + AHEAD, "Q·K ahead waits for the next tile before refilling the last one's stage");
};

template <class C>
__device__ __forceinline__ mbarrier* overlap_q_full(char* smem) {
    return reinterpret_cast<mbarrier*>(smem + C::BAR_OFF) + C::STAGES;
}

// Per-thread state: the warp's Q fragments and O accumulator, and row red_row's online softmax
// (as AttnState: the running max kept by all the row's reducers, each reducer's share of the sum).
template <class C>
struct OverlapState {
    unsigned qf[C::M_TILES][C::K_STEPS][4];
    float o_acc[C::M_TILES][C::DV_W / 8][4];
    float row_max, row_sum, score_scale;
    int ring_pos;  // KV tiles that have passed through the ring (all ranges so far)
};

struct OverlapCoords {
    int lane, warp, group, key_half, g, q4, red_row, red_col0;
    template <class C>
    __device__ __forceinline__ static OverlapCoords of() {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = threadIdx.x;
        return {lane, warp, warp % C::DIM_GROUPS, warp / C::DIM_GROUPS, lane / 4, lane % 4,
                t / C::RED_THREADS, (t % C::RED_THREADS) * C::RED_COLS};
    }
};

// Barriers, Q (staged through the ring by warp 0's bulk copies; rows >= num_rows repeat the last
// row and are padding) into fragments, O zeroed.
template <class C, class QRows>
__device__ __forceinline__ void overlap_begin(char* smem, OverlapState<C>& st, const QRows& q_rows, int num_rows,
                                              float scale_log2) {
    const OverlapCoords w = OverlapCoords::of<C>();
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; ++s) mbar_init(ring_full<C>(smem, s), C::WARPS);
        mbar_init(overlap_q_full<C>(smem), 1);
        mbar_init_fence();
    }
    __syncthreads();
    st.ring_pos = 0;
    if (w.warp == 0) {
        if (w.lane == 0) mbar_arrive_expect_tx(overlap_q_full<C>(smem), C::BM * C::Q_ROW);
        __syncwarp();
        bulk_copy(smem + w.lane * C::Q_STRIDE, q_rows.row(min(w.lane, num_rows - 1), 0), C::Q_ROW,
                  overlap_q_full<C>(smem));
    }
    mbar_wait(overlap_q_full<C>(smem), 0);
    ldmatrix_q<C>(st.qf, smem, 0, w.group, w.lane);
    start_rows(st.o_acc, st);
    st.score_scale = scale_log2;
    // (attend_range's first barrier keeps the ring from refilling before every warp has its Q)
}

// This warp's share of the rows of the tile at ring position `pos` (its lane i < WARP_ROWS: row
// warp * WARP_ROWS + i, fetched as `row`).
template <class C, class Keys>
__device__ __forceinline__ void overlap_stage(char* smem, const Keys& keys, PendingRow row, int pos,
                                              const OverlapCoords& w) {
    const int stage = pos % C::STAGES;
    if (w.lane == 0) mbar_arrive_expect_tx(ring_full<C>(smem, stage), C::WARP_ROWS * C::KV_ROW);
    __syncwarp();
    if (w.lane < C::WARP_ROWS)
        bulk_copy(smem + (stage * C::BN + w.warp * C::WARP_ROWS + w.lane) * C::KV_STRIDE, keys.row(row.j, row.fetched),
                  C::KV_ROW, ring_full<C>(smem, stage));
}

// This warp's rows of tile `tile` (lanes < WARP_ROWS).
template <class C, class Keys>
__device__ __forceinline__ PendingRow overlap_fetch(const Keys& keys, int num_keys, int tile, const OverlapCoords& w) {
    return fetch_row<C::BN>(tile, w.warp * C::WARP_ROWS + w.lane % C::WARP_ROWS, num_keys, keys);
}

// This warp's partial scores of the tile at ring position pos, once its bytes are in.
template <class C>
__device__ __forceinline__ void overlap_qk(float (&s_acc)[C::M_TILES][C::WARP_KEYS / 8][4], char* smem,
                                           const OverlapState<C>& st, int pos, const OverlapCoords& w) {
    const int stage = pos % C::STAGES;
    mbar_wait(ring_full<C>(smem, stage), (pos / C::STAGES) & 1);
    qk_partial<C>(s_acc, st.qf, smem + stage * C::BN * C::KV_STRIDE, w.group, w.key_half * C::WARP_KEYS, w.lane);
}

// Attend over key rows [tile_begin*BN, tile_end*BN) of a range of num_keys keys, continuing the
// online softmax in `st`. Every thread of the CTA calls it.
//   keys:          row source of the key/value rows of the range (rows < num_keys)
//   visible(r, t): whether query row r sees key t < num_keys
template <class C, class Keys, class Visible>
__device__ __forceinline__ void overlap_range(char* smem, OverlapState<C>& st, const Keys& keys, int num_keys,
                                              Visible visible, int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;  // (an empty range may have no keys to fetch)
    float* s_part = reinterpret_cast<float*>(smem + C::S_OFF);
    const OverlapCoords w = OverlapCoords::of<C>();
    const int lane = w.lane;

    __syncthreads();  // every warp is done with the ring's earlier tiles (and the schedule's scratch)
    {
        PendingRow rows[C::STAGES];
#pragma unroll
        for (int i = 0; i < C::STAGES; ++i)
            if (tile_begin + i < tile_end) rows[i] = overlap_fetch<C>(keys, num_keys, tile_begin + i, w);
#pragma unroll
        for (int i = 0; i < C::STAGES; ++i)
            if (tile_begin + i < tile_end) overlap_stage<C>(smem, keys, rows[i], st.ring_pos + i, w);
    }
    float s_acc[C::M_TILES][C::WARP_KEYS / 8][4];
    if constexpr (C::AHEAD) overlap_qk<C>(s_acc, smem, st, st.ring_pos, w);

    PendingRow next{};  // this warp's rows of tile - 1 + STAGES, fetched a tile before they are staged
    if (tile_begin + C::STAGES < tile_end) next = overlap_fetch<C>(keys, num_keys, tile_begin + C::STAGES, w);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++st.ring_pos) {
        const int stage = st.ring_pos % C::STAGES;
        const PendingRow refill = next;
        if (tile + C::STAGES < tile_end) next = overlap_fetch<C>(keys, num_keys, tile + C::STAGES, w);

        // 1. Partial scores over this warp's dims and keys, to shared memory; with AHEAD they were
        // issued a tile ago, and the next tile's go to the tensor pipe now.
        if constexpr (!C::AHEAD) overlap_qk<C>(s_acc, smem, st, st.ring_pos, w);
        store_partial<C>(s_part, s_acc, w.group, 0, w.key_half * C::WARP_KEYS, w.g, w.q4);
        if constexpr (C::AHEAD)
            if (tile + 1 < tile_end) overlap_qk<C>(s_acc, smem, st, st.ring_pos + 1, w);
        __syncthreads();
        // Every warp is done with tile - 1 (its P·V came before this barrier): refill its stage.
        if (tile > tile_begin && tile - 1 + C::STAGES < tile_end)
            overlap_stage<C>(smem, keys, refill, st.ring_pos - 1 + C::STAGES, w);
        // 2. Sum the partials, online softmax (base 2), probabilities to shared memory.
        softmax_rows<C>(smem, st, tile, num_keys, visible, w.red_row, w.red_col0);
        __syncthreads();
        // 3. Rescale this warp's output columns and add P @ V.
        rescale_and_pv<C>(st.o_acc, smem, smem + stage * C::BN * C::KV_STRIDE, 0, w.warp * C::DV_W, lane);
    }
}

// Normalize and write the partial state: part_o[BM][DV] and part_lse[BM].
template <class C>
__device__ __forceinline__ void overlap_end(char* smem, const OverlapState<C>& st, float* __restrict__ part_o,
                                            float* __restrict__ part_lse) {
    float* inv_l_smem = reinterpret_cast<float*>(smem + C::INV_L_OFF);
    const OverlapCoords w = OverlapCoords::of<C>();
    finish_rows<C>(st, 1.f, inv_l_smem, part_lse, w.red_row);
    __syncthreads();
    store_o<C>(st.o_acc, inv_l_smem, part_o, 0, w.warp * C::DV_W, w.g, w.q4);
}

// attend() of attention_kernels.cuh for this design: the CTA's BM query rows over the key range
// `first`, then the range second_fn() returns (NoKeys: none), one online softmax.
template <class C, class QRows, class First, class SecondFn>
__device__ __forceinline__ void attend(char* smem, const QRows& q_rows, int num_rows, float scale_log2, float,
                                       const First& first, const SecondFn& second_fn, float* __restrict__ part_o,
                                       float* __restrict__ part_lse) {
    OverlapState<C> st;
    overlap_begin<C>(smem, st, q_rows, num_rows, scale_log2);
    overlap_range<C>(smem, st, first.keys, first.num_keys, first.visible, first.tile_begin, first.tile_end);
    const auto second = second_fn();
    if constexpr (is_key_range<decltype(second_fn())>)
        overlap_range<C>(smem, st, second.keys, second.num_keys, second.visible, second.tile_begin, second.tile_end);
    overlap_end<C>(smem, st, part_o, part_lse);
}

}  // namespace kgen
