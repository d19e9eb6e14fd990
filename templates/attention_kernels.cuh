// The attention kernels' bodies, for either loop design: the including source first includes the
// design's header (attention.cuh: mma.sync, sm_120; attention_wgmma.cuh: wgmma, sm_90), which
// defines its Config and attend(). Each CTA finds its split-KV work item (schedule.cuh), then
// attends its BM packed (token, head) rows over one or two key ranges into a partial state:
// part_o / part_lse slot blockIdx.x, merged by the combine kernel.
#pragma once
#include "kgen/rows.cuh"
#include "kgen/schedule.cuh"

namespace kgen {

// The rows of a work item: request b's (token, head) rows from row tile `row_tile` on, q viewed as
// [sum T * H, D].
struct ItemRows {
    int qo0, tokens;  // the request's first tree token and its tree size
    long long row0;   // first q row of the tile
    int rows;         // rows of the request from row0 on (> BM: the tile is full; <= 0: a cluster's pad tile)

    // Rows the CTA attends: the tile's, or for a pad tile the one row item_q_rows stages.
    __device__ __forceinline__ int attended() const { return max(rows, 1); }
};

// The Q rows a CTA stages: its tile's, or for a pad tile (a cluster's row tile past the request's
// rows, there only to copy its share of the KV tiles) the request's first row, whose attention it
// computes and no one reads.
template <class C>
__device__ __forceinline__ QueryRows<C> item_q_rows(const bf16* q, const ItemRows& r) {
    return {reinterpret_cast<const char*>(q + (r.rows > 0 ? r.row0 : (long long)r.qo0 * C::HEADS) * C::D)};
}

// The schedule's scratch lies in shared memory the design does not use before its first tile.
template <class C>
__device__ __forceinline__ char* schedule_scratch(char* smem) {
    static_assert(C::SCRATCH_OFF % 8 == 0 && C::SCRATCH_OFF + SCHEDULE_SCRATCH_BYTES <= C::SMEM_BYTES,
                  "the schedule's scratch fits the design's shared memory");
    return smem + C::SCRATCH_OFF;
}

template <class C>
__device__ __forceinline__ ItemRows item_rows(const ScheduleArgs& schedule, const WorkItem& item) {
    const int qo0 = schedule.qo_indptr[item.b], tokens = schedule.qo_indptr[item.b + 1] - qo0;
    return {qo0, tokens, (long long)qo0 * C::HEADS + item.row_tile * C::BM, tokens * C::HEADS - item.row_tile * C::BM};
}

// The tree tokens of a request as keys, under its mask rows (RequestMask: qo0 -> its first row).
template <class C, int MASK_WORDS, class RequestMask>
__device__ __forceinline__ KeyRange<KeyRows<C>, TreeVisible<C, MASK_WORDS>> tree_range(
    const char* k_tree, const RequestMask& request_mask, const ItemRows& r, int row_tile, bool attend_tree) {
    const int tiles = attend_tree ? (r.tokens + C::BN - 1) / C::BN : 0;
    return {KeyRows<C>{k_tree + (long long)r.qo0 * C::KV_ROW}, r.tokens,
            TreeVisible<C, MASK_WORDS>{request_mask(r.qo0), row_tile, r.rows}, 0, tiles};
}

// prefix_attn (FUSE_TREE false) and verify_attn: the item's split of the request's paged prefix;
// verify's last split of each row tile goes on with the request's tree tokens, so the tree joins
// the same online softmax and needs no partial state (nor launch) of its own.
template <class C, int PAGE_SIZE, bool FUSE_TREE, int MASK_WORDS, class RequestMask>
__device__ __forceinline__ void prefix_attention(char* smem, const bf16* q, const char* kv_cache, float kv_scale,
                                                 const int* kv_indptr, const int* kv_indices,
                                                 const ScheduleArgs& schedule, float* part_o, float* part_lse,
                                                 long long num_slots, const TileMap* tile_map, const char* k_tree,
                                                 const RequestMask& request_mask, float scale_log2) {
    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN, C::CLUSTER>(schedule, schedule_scratch<C>(smem));
    if (item.b < 0) return;
    const ItemRows r = item_rows<C>(schedule, item);
    const int page0 = kv_indptr[item.b], prefix_len = max(schedule.kv_lens[item.b], 0);
    const PagedRows<C::KV_ROW, PAGE_SIZE> pages{kv_cache, kv_indices + page0, kv_indptr[item.b + 1] - page0,
                                                        num_slots, schedule.validate, schedule.error_flag, tile_map};
    const KeyRange<decltype(pages), AllVisible> prefix{pages, prefix_len, AllVisible{}, item.tile_begin, item.tile_end};
    const QueryRows<C> q_rows = item_q_rows<C>(q, r);
    float* o = part_o + (long long)blockIdx.x * C::BM * C::DV;
    float* lse = part_lse + (long long)blockIdx.x * C::BM;
    if constexpr (FUSE_TREE) {
        // Made after the prefix range: its values are read again rather than held through the loop.
        const auto tree = [&] {
            const bool last_split = item.tile_end == (prefix_len + C::BN - 1) / C::BN;
            WorkItem again = item;
            // the request's addresses and rows made anew from these, not held through the loop
            asm volatile("" : "+r"(again.b), "+r"(again.row_tile));
            return tree_range<C, MASK_WORDS>(k_tree, request_mask, item_rows<C>(schedule, again), again.row_tile,
                                             last_split);
        };
        attend<C>(smem, q_rows, r.attended(), scale_log2, kv_scale, prefix, tree, o, lse);
    } else {
        attend<C>(smem, q_rows, r.attended(), scale_log2, kv_scale, prefix, [] { return NoKeys{}; }, o, lse);
    }
}

// tree_attn: a request's tree tokens against each other under the mask; one work item per row
// tile (the schedule runs with every kv_len 0).
template <class C, int MASK_WORDS, class RequestMask>
__device__ __forceinline__ void tree_attention(char* smem, const bf16* q, const char* k_tree, float kv_scale,
                                               const RequestMask& request_mask, const ScheduleArgs& schedule,
                                               float* part_o, float* part_lse, float scale_log2) {
    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN, C::CLUSTER>(schedule, schedule_scratch<C>(smem));
    if (item.b < 0) return;
    const ItemRows r = item_rows<C>(schedule, item);
    attend<C>(smem, item_q_rows<C>(q, r), r.attended(), scale_log2, kv_scale,
              tree_range<C, MASK_WORDS>(k_tree, request_mask, r, item.row_tile, true), [] { return NoKeys{}; },
              part_o + (long long)blockIdx.x * C::BM * C::DV, part_lse + (long long)blockIdx.x * C::BM);
}

}  // namespace kgen
