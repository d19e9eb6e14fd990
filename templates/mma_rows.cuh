// The overlap loop's mma.sync pieces (attention_overlap.cuh): Q·K partial scores over a dim group's
// k-steps, their exchange and the online softmax of a tile, P·V, and the normalized output, each
// for a slice of rows (row0, 16-row tiles) and of value dims (dim0), read from the design's Config C.
// The fragment pieces both loops share are in mma_fragments.cuh; key_dim, key_fragments and
// rescale_and_pv differ between them (the row-block loop's read the DSA pool's scaled rows, which
// this loop does not serve; these are sliced by rows and dims).
#pragma once
#include "kgen/mma_fragments.cuh"

namespace kgen {

// First key dim of this warp group's k-step `ks`: its value/latent slice, then its rope steps.
template <class C>
__device__ __forceinline__ int key_dim(int group, int ks) {
    return ks < C::VALUE_STEPS ? group * C::DV_G + ks * C::K_STEP
                               : C::DV + ((ks - C::VALUE_STEPS) * C::DIM_GROUPS + group) * C::K_STEP;
}

// B operands of S = Q·K^T for the k-step at byte k_byte of the K_BLOCK keys from key0: kb[n] for
// keys key0 + [8n, 8n + 8).
// KEYS = 8 (bf16 only): the 8 keys from key0.
template <class C, int KEYS = C::K_BLOCK>
__device__ __forceinline__ void key_fragments(unsigned (&kb)[KEYS / 8][2], const char* kt, int key0, int k_byte,
                                              int lane) {
    static_assert(KEYS == C::K_BLOCK || (KEYS == 8 && !C::KV_FP8), "fp8 key blocks are whole");
    if constexpr (KEYS == 8) {
        ldmatrix_x2(kb[0], kt + (key0 + lane % 8) * C::KV_STRIDE + k_byte + ((lane / 8) % 2) * 16);
    } else if constexpr (C::MMA_F16) {
        f16_key_fragments<C>(kb, kt, key0, k_byte, lane);
    } else {
        key_fragments_32b<C>(kb, kt, key0, k_byte, lane);
    }
}

// bf16 Q fragments of dim group `group`'s k-steps for the 16-row tiles from row0 of the staged Q tile.
template <class C, int MT>
__device__ __forceinline__ void ldmatrix_q(unsigned (&qf)[MT][C::K_STEPS][4], const char* smem, int row0, int group,
                                           int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ks = 0; ks < C::K_STEPS; ++ks)
            if (has_step<C>(group, ks))
                ldmatrix_x4(qf[mt][ks], smem + (row0 + mt * 16 + lane % 16) * C::Q_STRIDE + key_dim<C>(group, ks) * 2 +
                                            (lane / 16) * 16);
}

// Partial scores S = Q·K^T over dim group `group`'s k-steps for the NT * 8 keys from key_first of a
// staged tile. Fewer than 4 accumulator tiles (MT * NT) split the k-steps by parity into two chains,
// summed at the end, so that at least 4 MMAs are independent.
template <class C, int MT, int NT>
__device__ __forceinline__ void qk_partial(float (&s_acc)[MT][NT][4], const unsigned (&qf)[MT][C::K_STEPS][4],
                                           const char* kt, int group, int key_first, int lane) {
    constexpr int KEYS = NT * 8 < C::K_BLOCK ? NT * 8 : C::K_BLOCK;  // keys per fragment load
    constexpr int CHAINS = MT * NT < 4 ? 2 : 1;
    float acc[CHAINS][MT][NT][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[c][mt][n][k] = 0.f;
#pragma unroll
    for (int ks = 0; ks < C::K_STEPS; ++ks) {
        if (!has_step<C>(group, ks)) continue;  // warp-uniform
#pragma unroll
        for (int key0 = 0; key0 < NT * 8; key0 += KEYS) {
            unsigned kb[KEYS / 8][2];
            key_fragments<C, KEYS>(kb, kt, key_first + key0, key_dim<C>(group, ks) * C::KV_ELEM, lane);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < KEYS / 8; ++n)
                    mma<C>(acc[ks % CHAINS][mt][key0 / 8 + n], qf[mt][ks], kb[n][0], kb[n][1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int k = 0; k < 4; ++k) s_acc[mt][n][k] = CHAINS == 2 ? acc[0][mt][n][k] + acc[CHAINS - 1][mt][n][k]
                                                                      : acc[0][mt][n][k];
}

// Store partial scores of the 16-row tiles from row0, keys from col0, as dim group `group`'s rows of
// s_part [DIM_GROUPS][BM][S_STRIDE] for the reducers.
template <class C, int MT, int NT>
__device__ __forceinline__ void store_partial(float* s_part, const float (&s_acc)[MT][NT][4], int group, int row0,
                                              int col0, int g, int q4) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float* a = s_acc[mt][n];
            float* dst = s_part + (group * C::BM + row0 + mt * 16 + g) * C::S_STRIDE + col0 + n * 8 + 2 * q4;
            *reinterpret_cast<float2*>(dst) = make_float2(a[0], a[1]);
            *reinterpret_cast<float2*>(dst + 8 * C::S_STRIDE) = make_float2(a[2], a[3]);
        }
}

// A fresh state for the rows: O zero, no key seen (the online softmax's running max and sum).
template <int MT, int NT, class State>
__device__ __forceinline__ void start_rows(float (&o)[MT][NT][4], State& st) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int k = 0; k < 4; ++k) o[mt][n][k] = 0.f;
    st.row_max = neg_inf();
    st.row_sum = 0.f;
}

// Row red_row's share of key tile `tile` (softmax_row): its probabilities into P and the row's
// rescale factor alpha.
template <class C, class State, class Visible>
__device__ __forceinline__ void softmax_rows(char* smem, State& st, int tile, int num_keys, const Visible& visible,
                                             int red_row, int red_col0) {
    float p[C::RED_COLS];
    const auto row_visible = [&](int, int key) { return visible(red_row, key); };
    const SoftmaxStep step = softmax_row<C>(smem, st, tile, num_keys, row_visible, red_row, red_col0, p);
    store_p_row<C>(smem, red_row, red_col0, p, step.alpha);
}

// o += P · V over one staged tile for the 16-row tiles from row0 and the value dims from dim0
// (NT 8-dim tiles), after rescaling those rows by their alpha. Once the running maxima settle
// (most tiles of a long prefix) alpha is 1 and the rescale is skipped.
template <class C, int MT, int NT>
__device__ __forceinline__ void rescale_and_pv(float (&o)[MT][NT][4], const char* smem, const char* kt, int row0,
                                               int dim0, int lane) {
    const float* alpha_smem = reinterpret_cast<const float*>(smem + C::ALPHA_OFF);
    const int g = lane / 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const float a_lo = alpha_smem[row0 + mt * 16 + g], a_hi = alpha_smem[row0 + mt * 16 + g + 8];
        if (__all_sync(0xffffffffu, a_lo == 1.f && a_hi == 1.f)) continue;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[mt][n][0] *= a_lo; o[mt][n][1] *= a_lo;
            o[mt][n][2] *= a_hi; o[mt][n][3] *= a_hi;
        }
    }
    const char* p_smem = smem + C::P_OFF;
    constexpr int STEPS = C::V_BLOCK / C::K_STEP;  // MMA k-steps per key block
#pragma unroll
    for (int key0 = 0; key0 < C::BN; key0 += C::V_BLOCK) {
        unsigned pf[MT][STEPS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
                ldmatrix_x4(pf[mt][s], p_smem + (row0 + mt * 16 + (lane % 16)) * C::P_STRIDE +
                                           (key0 / C::K_STEP + s) * 32 + (lane / 16) * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned vb[STEPS][2][2];
            value_fragments<C>(vb, kt, key0, dim0 + np * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int s = 0; s < STEPS; ++s) {
                    mma<C>(o[mt][2 * np], pf[mt][s], vb[s][0][0], vb[s][0][1]);
                    mma<C>(o[mt][2 * np + 1], pf[mt][s], vb[s][1][0], vb[s][1][1]);
                }
        }
    }
}

// Each row's reducers sum their shares of the running sum; one of them writes the row's lse and
// 1/l (times out_scale) for store_o.
template <class C, class State>
__device__ __forceinline__ void finish_rows(const State& st, float out_scale, float* inv_l_smem, float* __restrict__ part_lse,
                                            int red_row) {
    float row_sum = st.row_sum;
#pragma unroll
    for (int off = 1; off < C::RED_THREADS; off *= 2) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
    if (threadIdx.x % C::RED_THREADS == 0) {
        inv_l_smem[red_row] = row_inv_l(row_sum, out_scale);
        part_lse[red_row] = row_lse(st.row_max, row_sum);
    }
}

// Write the normalized accumulator of the 16-row tiles from row0 and value dims from dim0 to part_o[BM][DV].
template <class C, int MT, int NT>
__device__ __forceinline__ void store_o(const float (&acc)[MT][NT][4], const float* inv_l_smem, float* __restrict__ part_o,
                                        int row0, int dim0, int g, int q4) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int r = row0 + mt * 16 + g;
        const float il_lo = inv_l_smem[r], il_hi = inv_l_smem[r + 8];
        float* lo = part_o + r * C::DV;
        float* hi = part_o + (r + 8) * C::DV;
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            const float* e = acc[mt][2 * np];
            const float* o = acc[mt][2 * np + 1];
            const int d = dim0 + np * 16;
            if constexpr (C::KV_FP8) {  // even/odd dim tiles (value_fragments): this lane holds dims d + 4q .. +3
                *reinterpret_cast<float4*>(lo + d + 4 * q4) = make_float4(e[0] * il_lo, o[0] * il_lo, e[1] * il_lo, o[1] * il_lo);
                *reinterpret_cast<float4*>(hi + d + 4 * q4) = make_float4(e[2] * il_hi, o[2] * il_hi, e[3] * il_hi, o[3] * il_hi);
            } else {  // two 8-dim tiles: this lane holds dims d + 2q, +1 and d + 8 + 2q, +1
                *reinterpret_cast<float2*>(lo + d + 2 * q4) = make_float2(e[0] * il_lo, e[1] * il_lo);
                *reinterpret_cast<float2*>(hi + d + 2 * q4) = make_float2(e[2] * il_hi, e[3] * il_hi);
                *reinterpret_cast<float2*>(lo + d + 8 + 2 * q4) = make_float2(o[0] * il_lo, o[1] * il_lo);
                *reinterpret_cast<float2*>(hi + d + 8 + 2 * q4) = make_float2(o[2] * il_hi, o[3] * il_hi);
            }
        }
    }
}

}  // namespace kgen
