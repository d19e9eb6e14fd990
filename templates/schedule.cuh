// Split-KV schedule, found by every attention CTA for itself: no schedule kernel and no host
// sync (CUDA graphs), so a call is two launches (attention, combine).
//
// Request b has mt_b = ceil(T_b*H/BM) row tiles and nt_b = ceil(L_b/BN) KV tiles. All requests'
// work W = sum mt_b*nt_b is cut into splits of `chunk` KV tiles, chunk = max(min_split_tiles,
// ceil(W/target_ctas)), so the attention grid is about target_ctas CTAs whatever the batch.
// Request b gets s_b = max(min_splits, ceil(nt_b/chunk)) splits; its work items are (split, row
// tile) pairs, row tile fastest, so the CTAs that share a KV chunk run side by side and the chunk
// is read from DRAM once. CTA i does item i; CTAs past the last item have none. min_splits = 1
// gives a request with no prefix one (empty) split all the same: verify_attn does its tree in
// the last split, and tree_attn (all kv_lens 0) gets one item per row tile.
//
//   req_meta[b] = (first item, splits, 0, row tiles), written by CTA 0 for the combine kernel; the
//   partial state of item i is slot i of part_o / part_lse.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

struct RequestShape {
    int tokens, keys, row_tiles, kv_tiles;
};

// Lengths are clamped to what the kernels can index; `report` flags the bad ones (KGEN_VALIDATE).
template <int HEADS, int BM, int BN>
__device__ __forceinline__ RequestShape request_shape(const int* qo_indptr, const int* kv_lens, int b, int max_nodes,
                                                      bool report, int* error_flag) {
    int tokens = qo_indptr[b + 1] - qo_indptr[b];
    int keys = kv_lens[b];
    if (tokens < 0 || tokens > max_nodes || keys < 0) {
        if (report) atomicOr(error_flag, 1);
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

struct WorkItem {
    int b;  // request, or -1: this CTA has no item
    int row_tile, tile_begin, tile_end;  // KV tiles [tile_begin, tile_end) of the request's prefix
};

struct ScheduleArgs {
    const int* qo_indptr;
    const int* kv_lens;
    int batch, target_ctas, min_split_tiles, min_splits, max_nodes, total_tokens, validate;
    int* error_flag;
    int4* req_meta;
};

// The schedule's shared-memory scratch: SCHEDULE_SCRATCH_BYTES at a loop design's SCRATCH_OFF.
struct ScheduleScratch {
    int scan[32];                 // block_inclusive_sum's warp totals
    unsigned long long sums[32];  // block_reduce's per-warp sums of the work
    int found[4];                 // this CTA's WorkItem (request, row tile, first and end KV tile)
};
constexpr int SCHEDULE_SCRATCH_BYTES = sizeof(ScheduleScratch);
static_assert(SCHEDULE_SCRATCH_BYTES == 400 && alignof(ScheduleScratch) == 8, "the scratch layout");

// This CTA's work item. Every thread of the CTA calls it; `scratch` is SCHEDULE_SCRATCH_BYTES of
// shared memory (8-byte aligned) that the caller does not use until the call returns. Not inlined:
// it runs once per CTA, and out of line its temporaries stay out of the attention loop's register
// allocation (inlined, the fp8 verify kernel for sm_90 spilled a register at the 168-register cap).
template <int HEADS, int BM, int BN>
__device__ __noinline__ WorkItem find_work_item(const ScheduleArgs a, void* scratch) {
    ScheduleScratch* sc = static_cast<ScheduleScratch*>(scratch);
    int* scan = sc->scan;
    unsigned long long* sums = sc->sums;
    int* found = sc->found;
    const bool report = a.validate && blockIdx.x == 0;  // one CTA reports bad lengths
    if (threadIdx.x == 0) {
        found[0] = -1;
        if (report && (a.qo_indptr[0] != 0 || a.qo_indptr[a.batch] != a.total_tokens)) atomicOr(a.error_flag, 1);
    }
    unsigned long long mine = 0;
    for (int b = threadIdx.x; b < a.batch; b += blockDim.x) {
        const RequestShape r = request_shape<HEADS, BM, BN>(a.qo_indptr, a.kv_lens, b, a.max_nodes, report, a.error_flag);
        mine += (unsigned long long)r.row_tiles * r.kv_tiles;
    }
    const unsigned long long total_work = block_reduce<Sum>(mine, sums);
    const long long chunk = max((long long)a.min_split_tiles,
                                ((long long)total_work + a.target_ctas - 1) / a.target_ctas);

    // Requests in blocks of blockDim.x: a scan of their item counts finds the request holding
    // item blockIdx.x. CTA 0 goes through all of them to write req_meta.
    int items_before = 0;
    for (int base = 0; base < a.batch; base += blockDim.x) {
        const int b = base + threadIdx.x;
        RequestShape r{};
        int splits = 0;
        if (b < a.batch) {
            r = request_shape<HEADS, BM, BN>(a.qo_indptr, a.kv_lens, b, a.max_nodes, false, a.error_flag);
            splits = max(a.min_splits, (int)((r.kv_tiles + chunk - 1) / chunk));
        }
        const int items = splits * r.row_tiles;
        int block_items;
        const int first = items_before + block_inclusive_sum(items, scan, &block_items) - items;
        items_before += block_items;
        if (b < a.batch) {
            if (blockIdx.x == 0) a.req_meta[b] = make_int4(first, splits, 0, r.row_tiles);
            const int local = static_cast<int>(blockIdx.x) - first;
            if (0 <= local && local < items) {  // this thread's request holds the CTA's item
                const long long begin = (local / r.row_tiles) * chunk;
                found[0] = b;
                found[1] = local % r.row_tiles;
                found[2] = (int)begin;
                found[3] = (int)min((long long)r.kv_tiles, begin + chunk);
            }
        }
        __syncthreads();  // found[] is complete and the same for every thread
        if (blockIdx.x != 0 && found[0] >= 0) break;
    }
    return {found[0], found[1], found[2], found[3]};
}

}  // namespace kgen
