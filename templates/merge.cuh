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
    __device__ __forceinline__ float weight(float lse) const { return lse == neg_inf() ? 0.f : __expf(lse - max_lse); }
    __device__ __forceinline__ float add(float lse) {
        const float w = weight(lse);
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

// Final output of verify/prefix/tree attention: one CTA per output row (token, head) merges
// the request's split partials into o (bf16) and lse; each thread owns 4 of the DV dims. Weights
// go through shared memory so the loop over states issues independent loads (a dependent chain
// of L2 latencies per state was the cost).
// See schedule.cuh for the slot layout.
template <int HEADS, int DV, int BM>
__device__ __forceinline__ void combine_partials(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                                                 const int* __restrict__ qo_indptr, const int4* __restrict__ req_meta,
                                                 int batch, bf16* __restrict__ o, float* __restrict__ lse) {
    static_assert(DV % 4 == 0, "4 dims per thread");
    constexpr int CHUNK = 256;  // states whose weights are staged at a time
    __shared__ float weight[CHUNK];
    __shared__ float scratch[32];
    const long long out_row = blockIdx.x;  // token * HEADS + head
    const int token = static_cast<int>(out_row / HEADS), h = static_cast<int>(out_row % HEADS);
    int lo = 0, hi = batch - 1;  // last request whose first token is <= token
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (qo_indptr[mid] <= token) lo = mid; else hi = mid - 1;
    }
    const int4 meta = req_meta[lo];  // (first item, splits, 0, row tiles)
    const int r = (token - qo_indptr[lo]) * HEADS + h, row_tile = r / BM, row = r % BM;
    const int states = meta.y;
    auto at = [&](int s) {  // index of (split s, this row) in part_lse; times DV in part_o
        return ((long long)meta.x + s * meta.w + row_tile) * BM + row;
    };

    float m = neg_inf();
    for (int s = threadIdx.x; s < states; s += blockDim.x) m = fmaxf(m, part_lse[at(s)]);
    StateMerge merge(block_reduce<Max>(m, scratch));
    float local_sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < states; s0 += CHUNK) {
        const int n = min(CHUNK, states - s0);
        for (int k = threadIdx.x; k < n; k += blockDim.x) {
            const float w = merge.empty() ? 0.f : merge.weight(part_lse[at(s0 + k)]);
            weight[k] = w;
            local_sum += w;
        }
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < n; ++k) {
            const float w = weight[k];
            const float4 v = *reinterpret_cast<const float4*>(part_o + at(s0 + k) * DV + threadIdx.x * 4);
            if (w != 0.f) {  // a state that saw nothing adds nothing, whatever its o holds
                acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
            }
        }
        __syncthreads();
    }
    merge.weight_sum = block_reduce<Sum>(local_sum, scratch);
    const float inv = merge.inv_weight();
    uint2 packed = make_uint2(pack_bf16x2(acc.x * inv, acc.y * inv), pack_bf16x2(acc.z * inv, acc.w * inv));
    *reinterpret_cast<uint2*>(o + out_row * DV + threadIdx.x * 4) = packed;
    if (threadIdx.x == 0) lse[out_row] = merge.lse();
}

}  // namespace kgen
