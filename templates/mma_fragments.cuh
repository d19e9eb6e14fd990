// mma.sync fragment pieces both loops built on it share (the row-block loop, attention.cuh, and
// the overlap loop, mma_rows.cuh): which k-steps a warp group has, the MMA of the config's type,
// P stored in the order the P·V fragments read it, a row's online softmax over a tile, and the Q·K
// and P·V B fragments. C is the loop's config: its MMA type (MMA_E4M3 / MMA_F16 / bf16), KV_FP8,
// the staged KV_STRIDE and the steps.
#pragma once
#include "kgen/rows.cuh"

namespace kgen {

// Whether group `group` has a k-step `ks` (the rope steps may not divide evenly among groups).
template <class C>
__device__ __forceinline__ bool has_step(int group, int ks) {
    return ks < C::VALUE_STEPS || (ks - C::VALUE_STEPS) * C::DIM_GROUPS + group < C::ROPE_STEPS;
}

// d += a * b in the MMA type of the config.
template <class C>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (C::MMA_E4M3) mma_16832_e4m3(d, a, b0, b1);
    else if constexpr (C::MMA_F16) mma_16816_f16(d, a, b0, b1);
    else mma_16816(d, a, b0, b1);
}

// Store two probabilities of keys (c, c + 1) of a row (c even). e4m3: a 16-key block is stored
// in the k order of the P·V B fragments built from ldmatrix.trans (see value_fragments): key
// 2q+i+8h of the block sits at 4q+i+2h, so keys c, c + 1 stay adjacent.
template <class C>
__device__ __forceinline__ void store_p2(char* p_row, int c, float p0, float p1) {
    if constexpr (C::MMA_E4M3) {
        const int k = c % 16, pos = c - k + 4 * ((k % 8) / 2) + 2 * (k / 8);
        *reinterpret_cast<unsigned short*>(p_row + pos) = pack_e4m3x2(p0 * C::P_SCALE, p1 * C::P_SCALE);
    } else if constexpr (C::MMA_F16) {
        *reinterpret_cast<unsigned*>(p_row + c * 2) = pack_half2(p0, p1);
    } else {
        *reinterpret_cast<unsigned*>(p_row + c * 2) = pack_bf16x2(p0, p1);
    }
}

// Row red_row's share of key tile `tile` (its RED_COLS columns from red_col0), in both loops: the
// dim groups' partial scores (S_OFF) summed, masked (visible(c, key): column c, key index) and
// scaled, then the online softmax step (base 2) in st (row_max, row_sum, score_scale); p gets the
// probabilities. Returns the step (its alpha rescales the row's O).
template <class C, class State, class TileVisible>
__device__ __forceinline__ SoftmaxStep softmax_row(const char* smem, State& st, int tile, int num_keys,
                                                   const TileVisible& visible, int red_row, int red_col0,
                                                   float (&p)[C::RED_COLS]) {
    const float* s_part = reinterpret_cast<const float*>(smem + C::S_OFF);
    float s[C::RED_COLS];
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c) s[c] = 0.f;
#pragma unroll
    for (int gi = 0; gi < C::DIM_GROUPS; ++gi) {
        const float* part = s_part + (gi * C::BM + red_row) * C::S_STRIDE + red_col0;
#pragma unroll
        for (int c = 0; c < C::RED_COLS; c += 2) {
            const float2 v = *reinterpret_cast<const float2*>(part + c);
            s[c] += v.x; s[c + 1] += v.y;
        }
    }
    float tile_max = neg_inf();
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c) {
        const int key = tile * C::BN + red_col0 + c;
        s[c] = (key < num_keys && visible(c, key)) ? s[c] * st.score_scale : neg_inf();
        tile_max = fmaxf(tile_max, s[c]);
    }
    // Once a row's running max settles (most tiles of a long prefix) no reducer exceeds it,
    // and the reduction across the row's reducers is skipped.
    if (__any_sync(0xffffffffu, tile_max > st.row_max + C::MAX_SLACK)) {  // warp-uniform
#pragma unroll
        for (int off = 1; off < C::RED_THREADS; off *= 2)
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    }
    const SoftmaxStep step = online_softmax_step<C::MAX_SLACK>(st.row_max, tile_max);
    float tile_sum = 0.f;
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c) {
        p[c] = exp2_fast(s[c] - step.ref);
        tile_sum += p[c];
    }
    st.row_sum = st.row_sum * step.alpha + tile_sum;
    return step;
}

// Row red_row's probabilities into P and its alpha (by the row's first reducer) for the P·V warps.
template <class C>
__device__ __forceinline__ void store_p_row(char* smem, int red_row, int red_col0, const float (&p)[C::RED_COLS],
                                            float alpha) {
    char* p_row = smem + C::P_OFF + red_row * C::P_STRIDE;
#pragma unroll
    for (int c = 0; c < C::RED_COLS; c += 2) store_p2<C>(p_row, red_col0 + c, p[c], p[c + 1]);
    if (threadIdx.x % C::RED_THREADS == 0) reinterpret_cast<float*>(smem + C::ALPHA_OFF)[red_row] = alpha;
}

// B operands of S = Q·K^T from 32 bytes (one k-step of 16 bf16, or 32 e4m3, dims) at byte k_byte of
// the 16 keys from key0: kb[n] for keys key0 + [8n, 8n + 8).
template <class C>
__device__ __forceinline__ void key_fragments_32b(unsigned (&kb)[2][2], const char* kt, int key0, int k_byte, int lane) {
    // r[0], r[1] for keys 0-7 and r[2], r[3] for keys 8-15.
    unsigned r[4];
    ldmatrix_x4(r, kt + (key0 + (lane % 8) + (lane / 16) * 8) * C::KV_STRIDE + k_byte + ((lane / 8) % 2) * 16);
    kb[0][0] = r[0];
    kb[0][1] = r[1];
    kb[1][0] = r[2];
    kb[1][1] = r[3];
}

// f16 mode's B operands of S = Q·K^T: 16 dims (bytes from k_byte) of the 32 fp8 keys from key0, kb[n]
// for keys key0 + [8n, 8n + 8). Register i holds dims 4q .. 4q+3 of key 8i + g, split into two f16
// pairs (the permuted k order quantize_q gives Q).
template <class C>
__device__ __forceinline__ void f16_key_fragments(unsigned (&kb)[4][2], const char* kt, int key0, int k_byte, int lane) {
    unsigned r[4];
    ldmatrix_x4(r, kt + (key0 + lane) * C::KV_STRIDE + k_byte);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint2 dims = e4m3x4_to_f16x4(r[i]);
        kb[i][0] = dims.x;
        kb[i][1] = dims.y;
    }
}

// B operands of O += P·V for the V_BLOCK keys from key0 and value dims [dim, dim + 16):
// vb[s][t] for k-step s of the block and 8-dim tile t. bf16: tile 0 holds dims dim .. dim+7,
// tile 1 dims dim+8 .. dim+15. fp8: tile 0 holds the even dims, tile 1 the odd ones (attend_end
// interleaves them).
template <class C>
__device__ __forceinline__ void value_fragments(unsigned (&vb)[C::V_BLOCK / C::K_STEP][2][2], const char* kt, int key0,
                                                int dim, int lane) {
    if constexpr (!C::KV_FP8) {
        unsigned b[4];
        ldmatrix_x4_trans(b, kt + (key0 + (lane % 8) + ((lane / 8) % 2) * 8) * C::KV_STRIDE + (dim + (lane / 16) * 8) * 2);
        vb[0][0][0] = b[0];
        vb[0][0][1] = b[1];
        vb[0][1][0] = b[2];
        vb[0][1][1] = b[3];
    } else {
        // Four 8-key x 16-dim byte blocks, transposed as b16 pairs: t[i] holds keys 8i+2q, 8i+2q+1
        // of dims 2g, 2g+1.
        unsigned t[4];
        ldmatrix_x4_trans(t, kt + (key0 + lane) * C::KV_STRIDE + dim);
        if constexpr (C::MMA_E4M3) {
            // k = 32: byte permutes gather keys {2q, 2q+1, 2q+8, 2q+9} — the order store_p2 wrote P in.
            vb[0][0][0] = __byte_perm(t[0], t[1], 0x6420);
            vb[0][0][1] = __byte_perm(t[2], t[3], 0x6420);
            vb[0][1][0] = __byte_perm(t[0], t[1], 0x7531);
            vb[0][1][1] = __byte_perm(t[2], t[3], 0x7531);
        } else {
            // k = 16 in key order: keys 2q, 2q+1 (register 0) and 2q+8, 2q+9 (register 1) of k-step s
            // are t[2s] and t[2s+1]; a permute puts each dim's two keys side by side for the f16 convert.
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const uint2 dims = e4m3x4_to_f16x4(__byte_perm(t[2 * s + i], 0, 0x3120));
                    vb[s][0][i] = dims.x;
                    vb[s][1][i] = dims.y;
                }
        }
    }
}

// value_fragments of a scaled row in f16 mode, each key's values times its block scale over the
// warp's reference, rounded once: the scale enters P·V through V, not P. Lane k holds key k's
// `ratio` (tile_v_scale); register i of k-step s holds keys 16s + 8i + 2q and the next.
template <class C>
__device__ __forceinline__ void scaled_value_fragments(unsigned (&vb)[C::V_BLOCK / C::K_STEP][2][2], const char* kt,
                                                       int key0, int dim, int lane, float ratio) {
    static_assert(C::MMA_F16 && C::V_BLOCK / C::K_STEP == 2, "f16 fragments of 32 keys: two k-steps");
    value_fragments<C>(vb, kt, key0, dim, lane);
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int k = 16 * s + 8 * i + 2 * (lane % 4);
            const unsigned pair = pack_half2(__shfl_sync(0xffffffffu, ratio, k), __shfl_sync(0xffffffffu, ratio, k + 1));
            vb[s][0][i] = hmul2(vb[s][0][i], pair);
            vb[s][1][i] = hmul2(vb[s][1][i], pair);
        }
}

}  // namespace kgen
