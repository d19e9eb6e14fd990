// MLA attention of BM packed (token, head) query rows against a range of latent KV rows,
// producing a partial state: o (fp32, normalized) and its natural-log lse per row.
//
// Why this shape (sm_120: 99 KB of shared memory per block, mma.sync only):
// - All heads and tree tokens of a request share each latent row, so they are packed into the
//   MMA's M dimension: row r of a request is (token r / H, head r % H), and each staged KV row
//   serves all of them.
// - A 576-wide row is fat: 32 of them take 36 KB. The warps split the dims, not the rows:
//   warp group g (of 4) owns value dims [g*DV/4, (g+1)*DV/4) and key dims that plus rope dims
//   [DV + g*R/4, ...). It computes a partial score over its key dims, the 4 partials are summed
//   through shared memory, softmax runs once per row, and each group multiplies P by its own
//   value columns. Q fragments for the group's key dims stay in registers for the whole range.
// - KV tiles stream through a STAGES-deep cp.async ring; rows are padded by 16 B so ldmatrix
//   row addresses fall in different banks.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

template <int HEADS_, int D_, int DV_, int BM_, int BN_, int WARPS_M_, int DIM_GROUPS_, int STAGES_,
          int KV_ROW_PAD_, int S_ROW_PAD_, int P_ROW_PAD_>
struct AttnConfig {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = BM_, BN = BN_;
    static constexpr int WARPS_M = WARPS_M_, DIM_GROUPS = DIM_GROUPS_, STAGES = STAGES_;
    static constexpr int ROPE = D - DV;
    static constexpr int THREADS = 32 * WARPS_M * DIM_GROUPS;
    static constexpr int WARP_ROWS = BM / WARPS_M;
    static constexpr int M_TILES = WARP_ROWS / 16;
    static constexpr int DV_G = DV / DIM_GROUPS;    // value dims per group
    static constexpr int ROPE_G = ROPE / DIM_GROUPS;  // rope dims per group
    static constexpr int K_STEPS = (DV_G + ROPE_G) / 16;
    static constexpr int K_STEPS_NOPE = DV_G / 16;
    static constexpr int KV_STRIDE = D + KV_ROW_PAD_;  // bf16 elements per staged row
    static constexpr int S_STRIDE = BN + S_ROW_PAD_;   // floats per partial-score row
    static constexpr int P_STRIDE = BN + P_ROW_PAD_;   // bf16 per probability row
    // Shared memory layout (bytes); plan.attention_smem_bytes mirrors it.
    static constexpr int KV_BYTES = STAGES * BN * KV_STRIDE * 2;
    static constexpr int S_OFF = KV_BYTES;
    static constexpr int P_OFF = S_OFF + DIM_GROUPS * BM * S_STRIDE * 4;
    static constexpr int ALPHA_OFF = P_OFF + BM * P_STRIDE * 2;
    static constexpr int INV_L_OFF = ALPHA_OFF + BM * 4;
    static constexpr int SMEM_BYTES = INV_L_OFF + BM * 4;
    // Loader: each thread copies 16-byte chunks of one row per tile.
    static constexpr int ROW_CHUNKS = D * 2 / 16;
    static constexpr int LOADERS_PER_ROW = THREADS / BN;
    static constexpr int CHUNKS_PER_LOADER = ROW_CHUNKS / LOADERS_PER_ROW;
    // Softmax: each row's scores are reduced by RED_THREADS consecutive lanes.
    static constexpr int RED_THREADS = THREADS / BM;
    static constexpr int RED_COLS = BN / RED_THREADS;

    static_assert(M_TILES >= 1 && WARP_ROWS % 16 == 0, "each warp owns whole 16-row MMA tiles");
    static_assert(DV_G % 16 == 0 && ROPE_G % 16 == 0, "dim groups must be whole k16 steps");
    static_assert(BN % 16 == 0 && THREADS % BN == 0 && ROW_CHUNKS % LOADERS_PER_ROW == 0, "loader shape");
    static_assert(BM <= BN, "Q is staged through the KV ring with the KV loader");
    static_assert(THREADS % BM == 0 && BN % RED_THREADS == 0 && RED_COLS == 4, "softmax layout");
    static_assert(RED_THREADS <= 32 && 32 % RED_THREADS == 0, "a row's reducers share a warp");
};

// Copy one tile of BN rows into a staging buffer: row j < limit comes from row_ptr(j), the
// rest are zero-filled (so padding rows can never inject NaN/Inf into the MMAs).
template <class C, class RowPtr>
__device__ __forceinline__ void load_rows(bf16* buf, int tile_row0, int limit, RowPtr row_ptr) {
    const int row = threadIdx.x / C::LOADERS_PER_ROW;
    const int lane_chunk = threadIdx.x % C::LOADERS_PER_ROW;
    const bool valid = tile_row0 + row < limit;
    const bf16* base = valid ? row_ptr(tile_row0 + row) : reinterpret_cast<const bf16*>(buf);  // unread if !valid
    bf16* dst = buf + row * C::KV_STRIDE;
#pragma unroll
    for (int i = 0; i < C::CHUNKS_PER_LOADER; ++i) {
        const int c = lane_chunk + i * C::LOADERS_PER_ROW;
        cp_async_16(dst + c * 8, valid ? base + c * 8 : base, valid);
    }
}

// Key dim of this warp group's k-step `ks`: its value/latent slice first, then its rope slice.
template <class C>
__device__ __forceinline__ int key_dim(int group, int ks) {
    return ks < C::K_STEPS_NOPE ? group * C::DV_G + ks * 16 : C::DV + group * C::ROPE_G + (ks - C::K_STEPS_NOPE) * 16;
}

// Attention of this CTA's BM query rows over key rows [tile_begin*BN, tile_end*BN) of a range
// of num_keys keys.
//   q_row(r):      pointer to query row r (called for r < num_rows; later rows are padding)
//   key_row(t):    pointer to key/value row t of the range (called for t < num_keys)
//   visible(r, t): whether query row r sees key t < num_keys
// Writes part_o[BM][DV] (normalized) and part_lse[BM] (natural log; -inf for rows that saw nothing).
template <class C, class QRow, class KeyRow, class Visible>
__device__ __forceinline__ void attend(char* smem, QRow q_row, int num_rows, KeyRow key_row, int num_keys,
                                       Visible visible, int tile_begin, int tile_end, float scale_log2, float* __restrict__ part_o,
                                       float* __restrict__ part_lse) {
    bf16* kv = reinterpret_cast<bf16*>(smem);
    float* s_part = reinterpret_cast<float*>(smem + C::S_OFF);
    bf16* p_smem = reinterpret_cast<bf16*>(smem + C::P_OFF);
    float* alpha_smem = reinterpret_cast<float*>(smem + C::ALPHA_OFF);
    float* inv_l_smem = reinterpret_cast<float*>(smem + C::INV_L_OFF);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp % C::DIM_GROUPS;      // which dims this warp owns
    const int wrow0 = (warp / C::DIM_GROUPS) * C::WARP_ROWS;  // first query row of this warp
    const int g = lane / 4, q4 = lane % 4;       // mma fragment coordinates

    // Q fragments for this warp's rows and key dims, staged once through the KV ring.
    load_rows<C>(kv, 0, num_rows < C::BM ? num_rows : C::BM, q_row);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned qf[C::M_TILES][C::K_STEPS][4];
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
        for (int ks = 0; ks < C::K_STEPS; ++ks) {
            const int r = wrow0 + mt * 16 + (lane % 16);
            ldmatrix_x4(qf[mt][ks], kv + r * C::KV_STRIDE + key_dim<C>(group, ks) + (lane / 16) * 8);
        }
    __syncthreads();

    float o_acc[C::M_TILES][C::DV_G / 8][4];
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
        for (int n = 0; n < C::DV_G / 8; ++n)
#pragma unroll
            for (int k = 0; k < 4; ++k) o_acc[mt][n][k] = 0.f;

    // Softmax state of row red_row, kept (identically) by its RED_THREADS reducers.
    const int red_row = threadIdx.x / C::RED_THREADS;
    const int red_col0 = (threadIdx.x % C::RED_THREADS) * C::RED_COLS;
    float row_max = neg_inf(), row_sum = 0.f;

    auto stage = [&](int tile) { return kv + (tile % C::STAGES) * C::BN * C::KV_STRIDE; };
    for (int t = tile_begin; t < tile_begin + C::STAGES - 1; ++t) {
        if (t < tile_end) load_rows<C>(stage(t), t * C::BN, num_keys, key_row);
        cp_async_commit();
    }

    for (int tile = tile_begin; tile < tile_end; ++tile) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();  // tile is staged; everyone is done with the buffer refilled next
        {
            const int next = tile + C::STAGES - 1;
            if (next < tile_end) load_rows<C>(stage(next), next * C::BN, num_keys, key_row);
            cp_async_commit();
        }
        const bf16* kt = stage(tile);

        // 1. Partial scores over this group's key dims.
        float s_acc[C::M_TILES][C::BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
            for (int n = 0; n < C::BN / 8; ++n)
#pragma unroll
                for (int k = 0; k < 4; ++k) s_acc[mt][n][k] = 0.f;
#pragma unroll
        for (int ks = 0; ks < C::K_STEPS; ++ks) {
            const int k0 = key_dim<C>(group, ks);
#pragma unroll
            for (int np = 0; np < C::BN / 16; ++np) {
                unsigned b[4];
                const int n = np * 16 + (lane % 8) + (lane / 16) * 8;
                ldmatrix_x4(b, kt + n * C::KV_STRIDE + k0 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; ++mt) {
                    mma_16816(s_acc[mt][2 * np], qf[mt][ks], b[0], b[1]);
                    mma_16816(s_acc[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt)
#pragma unroll
            for (int n = 0; n < C::BN / 8; ++n) {
                const int r = wrow0 + mt * 16 + g, c = n * 8 + 2 * q4;
                float* dst = s_part + (group * C::BM + r) * C::S_STRIDE + c;
                *reinterpret_cast<float2*>(dst) = make_float2(s_acc[mt][n][0], s_acc[mt][n][1]);
                *reinterpret_cast<float2*>(dst + 8 * C::S_STRIDE) = make_float2(s_acc[mt][n][2], s_acc[mt][n][3]);
            }
        __syncthreads();

        // 2. Sum the partials, online softmax (base 2), probabilities to shared memory.
        {
            float s[C::RED_COLS];
#pragma unroll
            for (int c = 0; c < C::RED_COLS; ++c) s[c] = 0.f;
#pragma unroll
            for (int gi = 0; gi < C::DIM_GROUPS; ++gi) {
                const float4 v = *reinterpret_cast<const float4*>(s_part + (gi * C::BM + red_row) * C::S_STRIDE + red_col0);
                s[0] += v.x; s[1] += v.y; s[2] += v.z; s[3] += v.w;
            }
            float tile_max = neg_inf();
#pragma unroll
            for (int c = 0; c < C::RED_COLS; ++c) {
                const int key = tile * C::BN + red_col0 + c;
                s[c] = (key < num_keys && visible(red_row, key)) ? s[c] * scale_log2 : neg_inf();
                tile_max = fmaxf(tile_max, s[c]);
            }
#pragma unroll
            for (int off = 1; off < C::RED_THREADS; off *= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
            const float new_max = fmaxf(row_max, tile_max);
            const float ref = new_max == neg_inf() ? 0.f : new_max;  // a row that saw nothing yet
            const float alpha = exp2_fast(row_max - ref);
            float p[C::RED_COLS], tile_sum = 0.f;
#pragma unroll
            for (int c = 0; c < C::RED_COLS; ++c) {
                p[c] = exp2_fast(s[c] - ref);
                tile_sum += p[c];
            }
#pragma unroll
            for (int off = 1; off < C::RED_THREADS; off *= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, off);
            row_sum = row_sum * alpha + tile_sum;
            row_max = new_max;
            uint2 packed = make_uint2(pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3]));
            *reinterpret_cast<uint2*>(p_smem + red_row * C::P_STRIDE + red_col0) = packed;
            if (threadIdx.x % C::RED_THREADS == 0) alpha_smem[red_row] = alpha;
        }
        __syncthreads();

        // 3. Rescale this warp's output rows and add P @ V for its value columns.
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; ++mt) {
            const float a_lo = alpha_smem[wrow0 + mt * 16 + g], a_hi = alpha_smem[wrow0 + mt * 16 + g + 8];
#pragma unroll
            for (int n = 0; n < C::DV_G / 8; ++n) {
                o_acc[mt][n][0] *= a_lo; o_acc[mt][n][1] *= a_lo;
                o_acc[mt][n][2] *= a_hi; o_acc[mt][n][3] *= a_hi;
            }
        }
#pragma unroll
        for (int kk = 0; kk < C::BN / 16; ++kk) {
            unsigned pf[C::M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < C::M_TILES; ++mt)
                ldmatrix_x4(pf[mt], p_smem + (wrow0 + mt * 16 + (lane % 16)) * C::P_STRIDE + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int np = 0; np < C::DV_G / 16; ++np) {
                unsigned b[4];
                const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                ldmatrix_x4_trans(b, kt + key * C::KV_STRIDE + group * C::DV_G + np * 16 + (lane / 16) * 8);
#pragma unroll
                for (int mt = 0; mt < C::M_TILES; ++mt) {
                    mma_16816(o_acc[mt][2 * np], pf[mt], b[0], b[1]);
                    mma_16816(o_acc[mt][2 * np + 1], pf[mt], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue: normalize and write the partial state.
    if (threadIdx.x % C::RED_THREADS == 0) {
        const bool empty = row_sum == 0.f;
        inv_l_smem[red_row] = empty ? 0.f : 1.f / row_sum;
        part_lse[red_row] = empty ? neg_inf() : (row_max + __log2f(row_sum)) * LN2;
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; ++mt) {
        const int r = wrow0 + mt * 16 + g;
        const float il_lo = inv_l_smem[r], il_hi = inv_l_smem[r + 8];
#pragma unroll
        for (int n = 0; n < C::DV_G / 8; ++n) {
            const int c = group * C::DV_G + n * 8 + 2 * q4;
            *reinterpret_cast<float2*>(part_o + r * C::DV + c) = make_float2(o_acc[mt][n][0] * il_lo, o_acc[mt][n][1] * il_lo);
            *reinterpret_cast<float2*>(part_o + (r + 8) * C::DV + c) = make_float2(o_acc[mt][n][2] * il_hi, o_acc[mt][n][3] * il_hi);
        }
    }
}

}  // namespace kgen
