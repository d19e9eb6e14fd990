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

// Final output of verify/prefix/tree attention: one CTA per output row (token, head) merges the
// request's split partials into o (bf16) and lse. A group of DV / 4 threads owns the row's DV
// dims, 4 a thread; the CTA has blockDim.x / (DV / 4) groups (the host sizes it to the states a
// row can have, at most MAX_GROUPS). Group g takes states g, g + groups, ..., STATE_BATCH at a time
// with every load of a batch in flight before its first use, and merges them online (a running
// maximum), so no pass over the lse values comes first; the groups' states meet in shared memory.
// The chain a CTA waits on is the request search, its req_meta, and one latency per batch
// (a chain of a latency per state, 4 loads in flight, was this kernel's cost: bench/NOTES.md v26).
// The sparse verify launches it to overlap its attention kernel's tail (Variant.waits_for_prior):
// the search runs before the wait for that kernel's end, everything after it reads what that kernel
// wrote. Launched the usual way (the dense path) the wait returns at once.
// See schedule.cuh for the slot layout.

// The request holding `token`: the number of requests b >= 1 with qo_indptr[b] <= token (the
// last whose first token is at or before it; empty requests are passed over). Each warp counts
// for itself, 32 independent loads at a time.
__device__ __forceinline__ int request_of(const int* __restrict__ qo_indptr, int batch, int token) {
    const int lane = threadIdx.x % 32;
    int count = 0;
    for (int b0 = 1; b0 < batch; b0 += 32) {
        const int b = b0 + lane;
        count += __popc(__ballot_sync(0xffffffffu, b < batch && qo_indptr[b] <= token));
    }
    return count;
}

// A StateMerge whose maximum runs with the states added, and their o: the accumulator rescales
// when a larger lse comes.
struct OnlineMerge : StateMerge {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);

    __device__ __forceinline__ OnlineMerge() : StateMerge(neg_inf()) {}
    // A state (lse, o) standing for `weight` states' sum (1: a single state). A state that saw
    // nothing (lse = -inf) adds nothing, whatever its o holds.
    __device__ __forceinline__ void fold(float lse, float4 o, float weight = 1.f) {
        if (lse == neg_inf()) return;
        if (lse > max_lse) {
            const float c = __expf(max_lse - lse);  // 0 while nothing was added
            acc.x *= c; acc.y *= c; acc.z *= c; acc.w *= c;
            weight_sum *= c;
            max_lse = lse;
        }
        const float w = __expf(lse - max_lse);
        acc.x += w * o.x; acc.y += w * o.y; acc.z += w * o.z; acc.w += w * o.w;
        weight_sum += w * weight;
    }
};

template <int HEADS, int DV, int BM, int MAX_GROUPS, int STATE_BATCH, class PartO>
__device__ __forceinline__ void combine_partials(const PartO* __restrict__ part_o, const float* __restrict__ part_lse,
                                                 const int* __restrict__ qo_indptr, const int4* __restrict__ req_meta,
                                                 int batch, bf16* __restrict__ o, float* __restrict__ lse) {
    static_assert(DV % 4 == 0, "4 dims per thread");
    constexpr int COLS = DV / 4;
    __shared__ float4 group_acc[MAX_GROUPS][COLS];
    __shared__ float group_max[MAX_GROUPS], group_sum[MAX_GROUPS];
    const long long out_row = blockIdx.x;  // token * HEADS + head
    const int token = static_cast<int>(out_row / HEADS), h = static_cast<int>(out_row % HEADS);
    const int groups = blockDim.x / COLS, g = threadIdx.x / COLS, col = threadIdx.x % COLS;
    const int b = request_of(qo_indptr, batch, token);
    wait_for_prior_grid();  // the attention kernel's partial states and req_meta (its CTA 0 writes them)
    const int4 meta = req_meta[b];  // (first item, splits, stride, row tiles): schedule.cuh
    const int r = (token - qo_indptr[b]) * HEADS + h, row_tile = r / BM, row = r % BM;
    const int states = meta.y;
    auto at = [&](int s) {  // index of (split s, this row) in part_lse; times DV in part_o
        return ((long long)meta.x + (long long)s * meta.z + row_tile) * BM + row;
    };

    OnlineMerge merge;
    for (int s0 = g; s0 < states; s0 += groups * STATE_BATCH) {
        float l[STATE_BATCH];
        float4 v[STATE_BATCH];
#pragma unroll
        for (int k = 0; k < STATE_BATCH; ++k) {  // every load of the batch, then their uses
            const int s = s0 + k * groups;
            l[k] = s < states ? part_lse[at(s)] : neg_inf();
            v[k] = s < states ? load4(part_o + at(s) * DV + col * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < STATE_BATCH; ++k) merge.fold(l[k], v[k]);
    }
    group_acc[g][col] = merge.acc;
    if (col == 0) {
        group_max[g] = merge.max_lse;
        group_sum[g] = merge.weight_sum;
    }
    __syncthreads();
    if (g != 0) return;
    OnlineMerge all;  // the groups' merges, each a state of weight sum group_sum
    for (int k = 0; k < groups; ++k) all.fold(group_max[k], group_acc[k][col], group_sum[k]);
    const float inv = all.inv_weight();
    const float4 a = all.acc;
    *reinterpret_cast<uint2*>(o + out_row * DV + col * 4) =
        make_uint2(pack_bf16x2(a.x * inv, a.y * inv), pack_bf16x2(a.z * inv, a.w * inv));
    if (col == 0) lse[out_row] = all.lse();
}

}  // namespace kgen
