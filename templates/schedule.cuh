// Split-KV schedule, computed on the device so that no host sync is needed (CUDA graphs).
//
// Request b has mt_b = ceil(T_b*H/BM) row tiles and nt_b = ceil(L_b/BN) KV tiles. All requests'
// work W = sum mt_b*nt_b is cut into splits of `chunk` KV tiles, chunk = max(min_split_tiles,
// ceil(W/target_ctas)), so the attention grid is about target_ctas CTAs whatever the batch.
// Request b gets s_b = ceil(nt_b/chunk) splits; its prefix work items are (split, row tile)
// pairs, row tile fastest, so the CTAs that share a KV chunk run side by side and the chunk is
// read from DRAM once. Tree work items are one per row tile. min_splits = 1 gives a request
// with no prefix one (empty) split all the same: verify_attn does its tree in the last split.
//
//   work[i]      = (b, row tile, first KV tile, end KV tile), or b = -1 past the last item
//   tree_work[i] = (b, row tile), or b = -1
//   req_meta[b]  = (first work item, splits, first tree item, row tiles)
#pragma once
#include "kgen/common.cuh"

namespace kgen {

struct RequestShape {
    int tokens, keys, row_tiles, kv_tiles;
};

template <int HEADS, int BM, int BN>
__device__ __forceinline__ RequestShape request_shape(const int* qo_indptr, const int* kv_lens, int b, int max_nodes,
                                                      int validate, int* error_flag) {
    int tokens = qo_indptr[b + 1] - qo_indptr[b];
    int keys = kv_lens[b];
    if (tokens < 0 || tokens > max_nodes || keys < 0) {
        if (validate) atomicOr(error_flag, 1);
        tokens = min(max(tokens, 0), max_nodes);
        keys = max(keys, 0);
    }
    return {tokens, keys, (tokens * HEADS + BM - 1) / BM, (keys + BN - 1) / BN};
}

// Inclusive block-wide sum of one int per thread; returns it and the block total in *total.
__device__ __forceinline__ int block_inclusive_sum(int v, int* scratch, int* total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const int u = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += u;
    }
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = lane < warps ? scratch[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            const int u = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += u;
        }
        scratch[lane] = w;  // inclusive sums of warp totals
    }
    __syncthreads();
    if (warp > 0) v += scratch[warp - 1];
    *total = scratch[warps - 1];
    __syncthreads();
    return v;
}

// Last b in [0, n) with starts[b * stride] <= i (the non-empty request holding item i).
__device__ __forceinline__ int find_owner(const int* starts, int stride, int n, int i) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (starts[mid * stride] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <int HEADS, int BM, int BN>
__device__ __forceinline__ void schedule(const int* __restrict__ qo_indptr, const int* __restrict__ kv_lens,
                                         int batch, int target_ctas, int min_split_tiles, int min_splits,
                                         int work_capacity,
                                         int tree_capacity, int total_tokens, int max_nodes, int validate,
                                         int* __restrict__ error_flag, int4* __restrict__ work,
                                         int2* __restrict__ tree_work, int4* __restrict__ req_meta) {
    __shared__ unsigned long long total_work;
    __shared__ int scratch[32];
    if (threadIdx.x == 0) {
        total_work = 0;
        if (validate && (qo_indptr[0] != 0 || qo_indptr[batch] != total_tokens)) atomicOr(error_flag, 1);
    }
    __syncthreads();
    unsigned long long mine = 0;
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
        const RequestShape r = request_shape<HEADS, BM, BN>(qo_indptr, kv_lens, b, max_nodes, validate, error_flag);
        mine += (unsigned long long)r.row_tiles * r.kv_tiles;
    }
    atomicAdd(&total_work, mine);
    __syncthreads();
    const long long chunk = max((long long)min_split_tiles,
                                ((long long)total_work + target_ctas - 1) / target_ctas);

    int items_before = 0, tree_before = 0;
    for (int base = 0; base < batch; base += blockDim.x) {
        const int b = base + threadIdx.x;
        int splits = 0, row_tiles = 0;
        if (b < batch) {
            const RequestShape r = request_shape<HEADS, BM, BN>(qo_indptr, kv_lens, b, max_nodes, 0, error_flag);
            splits = max(min_splits, (int)((r.kv_tiles + chunk - 1) / chunk));
            row_tiles = r.row_tiles;
        }
        int items_total, tree_total;
        const int items_incl = block_inclusive_sum(splits * row_tiles, scratch, &items_total);
        const int tree_incl = block_inclusive_sum(row_tiles, scratch, &tree_total);
        if (b < batch)
            req_meta[b] = make_int4(items_before + items_incl - splits * row_tiles, splits,
                                    tree_before + tree_incl - row_tiles, row_tiles);
        items_before += items_total;
        tree_before += tree_total;
    }
    __syncthreads();  // req_meta is complete and visible to the block

    for (int i = threadIdx.x; i < work_capacity; i += blockDim.x) {
        if (i >= items_before) { work[i] = make_int4(-1, 0, 0, 0); continue; }
        const int b = find_owner(&req_meta[0].x, 4, batch, i);
        const int4 m = req_meta[b];
        const int local = i - m.x, split = local / m.w;
        const int kv_tiles = (max(kv_lens[b], 0) + BN - 1) / BN;
        const int begin = (int)(split * chunk);
        work[i] = make_int4(b, local % m.w, begin, (int)min((long long)kv_tiles, begin + chunk));
    }
    for (int i = threadIdx.x; i < tree_capacity; i += blockDim.x) {
        if (i >= tree_before) { tree_work[i] = make_int2(-1, 0); continue; }
        const int b = find_owner(&req_meta[0].z, 4, batch, i);
        tree_work[i] = make_int2(b, i - req_meta[b].z);
    }
}

}  // namespace kgen
