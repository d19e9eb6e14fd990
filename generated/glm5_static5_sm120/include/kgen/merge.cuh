// Merging attention states (o, lse): the result is what attention over the union of the key
// sets would give. lse is the natural-log log-sum-exp; a state with lse = -inf saw no keys and
// contributes nothing; if every state is empty the merge is o = 0, lse = -inf.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

// Running merge of states added one at a time, with weights relative to a known maximum.
struct StateMerge {
    float max_lse;
    float weight_sum = 0.f;

    __device__ __forceinline__ explicit StateMerge(float m) : max_lse(m) {}
    __device__ __forceinline__ bool empty() const { return max_lse == neg_inf(); }
    // Weight of a state with log-sum-exp `lse` (0 for an empty state).
    __device__ __forceinline__ float add(float lse) {
        float w = lse == neg_inf() ? 0.f : __expf(lse - max_lse);
        weight_sum += w;
        return w;
    }
    __device__ __forceinline__ float lse() const { return empty() ? neg_inf() : max_lse + __logf(weight_sum); }
    __device__ __forceinline__ float inv_weight() const { return empty() ? 0.f : 1.f / weight_sum; }
};

// o = merge((o_a, lse_a), (o_b, lse_b)) over `rows` rows of `width` elements (width % 8 == 0).
template <typename T>
__device__ __forceinline__ void merge_two(const T* __restrict__ o_a, const float* __restrict__ lse_a,
                                          const T* __restrict__ o_b, const float* __restrict__ lse_b,
                                          T* __restrict__ o, float* __restrict__ lse, long long rows,
                                          int width) {
    const int vecs = width / 8;
    const long long total = rows * vecs;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / vecs;
        const long long off = row * width + (i - row * vecs) * 8;
        const float la = lse_a[row], lb = lse_b[row];
        StateMerge m(fmaxf(la, lb));
        const float wa = m.add(la), wb = m.add(lb);
        const float inv = m.inv_weight();
        float a[8], b[8], r[8];
        load8(a, o_a + off);
        load8(b, o_b + off);
#pragma unroll
        for (int k = 0; k < 8; ++k) r[k] = (wa == 0.f ? 0.f : wa * a[k]) + (wb == 0.f ? 0.f : wb * b[k]);
#pragma unroll
        for (int k = 0; k < 8; ++k) r[k] *= inv;
        store8(o + off, r);
        if (i - row * vecs == 0) lse[row] = m.lse();
    }
}

}  // namespace kgen

namespace kgen {

// Final output of verify/prefix/tree attention: for each token (one CTA) and head, merge the
// request's split partials (and its tree partial when tree_slot_base >= 0) into o (bf16) and
// lse. Each thread owns 4 of the DV output dims. See schedule.cuh for the slot layout.
template <int HEADS, int DV, int BM>
__device__ __forceinline__ void combine_partials(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                                                 const int* __restrict__ qo_indptr, const int4* __restrict__ req_meta,
                                                 int batch, int tree_slot_base, bf16* __restrict__ o,
                                                 float* __restrict__ lse) {
    static_assert(DV % 4 == 0, "4 dims per thread");
    const int token = blockIdx.x;
    int lo = 0, hi = batch - 1;  // last request whose first token is <= token
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (qo_indptr[mid] <= token) lo = mid; else hi = mid - 1;
    }
    const int4 meta = req_meta[lo];  // (first item, splits, first tree item, row tiles)
    const int i = token - qo_indptr[lo];
    const int states = meta.y + (tree_slot_base >= 0 ? 1 : 0);
    auto slot = [&](int s, int row_tile) {
        return s < meta.y ? meta.x + s * meta.w + row_tile : tree_slot_base + meta.z + row_tile;
    };
    for (int h = 0; h < HEADS; ++h) {
        const int r = i * HEADS + h, row_tile = r / BM, row = r % BM;
        float m = neg_inf();
        for (int s = 0; s < states; ++s) m = fmaxf(m, part_lse[(long long)slot(s, row_tile) * BM + row]);
        StateMerge merge(m);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < states; ++s) {
            const long long sl = slot(s, row_tile);
            const float w = merge.add(part_lse[sl * BM + row]);
            if (w == 0.f) continue;
            const float4 v = *reinterpret_cast<const float4*>(part_o + (sl * BM + row) * DV + threadIdx.x * 4);
            acc[0] += w * v.x; acc[1] += w * v.y; acc[2] += w * v.z; acc[3] += w * v.w;
        }
        const float inv = merge.inv_weight();
        const long long out = ((long long)token * HEADS + h);
        uint2 packed = make_uint2(pack_bf16x2(acc[0] * inv, acc[1] * inv), pack_bf16x2(acc[2] * inv, acc[3] * inv));
        *reinterpret_cast<uint2*>(o + out * DV + threadIdx.x * 4) = packed;
        if (threadIdx.x == 0) lse[out] = merge.lse();
    }
}

}  // namespace kgen
