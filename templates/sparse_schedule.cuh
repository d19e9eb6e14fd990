// The sparse (DSA) verify's schedule: which (request, split, row tile) each attention CTA attends.
// As the dense schedule (schedule.cuh), every CTA can find its item for itself (write_sparse_item:
// two block reductions and a block scan over the requests, ~3 us at its start), and a prepared step
// also writes every CTA's item once into a schedule table (sparse_schedule, a launch of its own on
// the step's first call and on SparseStep.reschedule()); a CTA takes its item from the table when
// the table's stamp (the schedule's parameters and the qo_indptr it was made from) matches the
// call's, and finds it for itself otherwise: a stale table costs time, never correctness.
#pragma once
#include "kgen/schedule.cuh"

namespace kgen {

struct SparseArgs {
    const int* qo_indptr;
    const int* topk;  // [sum T, topk_width] slots, -1 = no key
    int topk_width, batch, target_ctas, min_chunk, max_chunk, max_nodes, total_tokens;
    int tree_apart;  // 1: each row tile's tree is a split of its own (kgen/sparse.py tree_apart), else it rides on the last
    int validate;
    int* error_flag;
    int4* req_meta;
    int* lists;  // per CTA: LIST_KEYS slots then LIST_KEYS masks
    long long num_slots;
};

// Tokens a row tile of BM rows can touch: BM / H when H divides BM, else one more (rounded up).
template <int HEADS, int BM>
constexpr int TILE_TOKENS = BM % HEADS == 0 ? BM / HEADS : (BM - 1) / HEADS + 2;

struct SparseItem {
    int b = -1;  // request, or -1: this CTA has no item
    int split, splits, row_tile;  // splits: those that share the row tile's prefix entries (SparseArgs::tree_apart: and
                                  // split == splits, which lists none, attends the tree alone)
};

// The item the schedule left in sc->found (every thread reads it after the schedule's last barrier).
__device__ __forceinline__ SparseItem found_item(const ScheduleScratch* sc) {
    SparseItem item;
    item.b = sc->found[0];
    item.split = sc->found[1];
    item.splits = sc->found[2];
    item.row_tile = sc->found[3];
    return item;
}

// This CTA's work item into sc->found (request, split, splits, row tile; request -1: none). Request
// b has R_b = ceil(T_b * H / BM) row tiles, each reading E_b = min(T_b, TILE_TOKENS) * K' list
// entries; request b gets S_b = max(1, ceil(E_b / chunk)) splits of chunk = min(max_chunk,
// max(min_chunk, ceil(W / slots))) entries, W = sum R_b * E_b. The items number at most W / chunk
// + sum R_b, so slots = target_ctas - sum R_b (where that is positive) keeps them within one wave of
// target_ctas CTAs whatever the batch (else slots = target_ctas); the gather kernel caps a split at
// one list's capacity. With tree_apart (the host's choice where R_b (S_b + 1) items still fit the
// wave) a row tile has S_b + 1 splits, the last one the tree's alone: else the split that attends
// the tree after its share of the keys ends the call (bench/NOTES.md v112). Items are ordered as the
// dense schedule's (split-major, row tile fastest), and CTA 0 writes req_meta[b] = (first item, its
// splits, R_b, R_b) for the combine kernel (the third: the stride between a row tile's splits).
// Every thread calls it. Not inlined: one call from the sparse kernel, whose registers the tile loop
// needs.
template <int HEADS, int BM>
__device__ __noinline__ void write_sparse_item(const SparseArgs a, ScheduleScratch* sc) {
    int* scan = sc->scan;
    unsigned long long* sums = sc->sums;
    int* found = sc->found;
    const bool report = a.validate && blockIdx.x == 0;
    if (threadIdx.x == 0) {
        found[0] = -1;
        if (report && (a.qo_indptr[0] != 0 || a.qo_indptr[a.batch] != a.total_tokens)) atomicOr(a.error_flag, 1);
    }
    auto shape = [&](int b, bool flag, int& row_tiles) {  // row tiles and list entries per tile of request b
        int tokens = a.qo_indptr[b + 1] - a.qo_indptr[b];
        if (tokens < 0 || tokens > a.max_nodes) {
            if (flag) atomicOr(a.error_flag, 1);
            tokens = min(max(tokens, 0), a.max_nodes);
        }
        row_tiles = (tokens * HEADS + BM - 1) / BM;
        return (long long)min(tokens, TILE_TOKENS<HEADS, BM>) * a.topk_width;
    };
    unsigned long long mine = 0, my_tiles = 0;
    for (int b = threadIdx.x; b < a.batch; b += blockDim.x) {
        int row_tiles;
        const long long entries = shape(b, report, row_tiles);
        mine += (unsigned long long)row_tiles * entries;
        my_tiles += row_tiles;
    }
    const unsigned long long work = block_reduce<Sum>(mine, sums);
    const long long row_tiles = block_reduce<Sum>(my_tiles, sums);
    const long long slots = row_tiles < a.target_ctas ? a.target_ctas - row_tiles : a.target_ctas;
    const long long chunk = min((long long)a.max_chunk, max((long long)a.min_chunk, ((long long)work + slots - 1) / slots));
    int items_before = 0;
    for (int base = 0; base < a.batch; base += blockDim.x) {
        const int b = base + threadIdx.x;
        int row_tiles = 0, splits = 0;
        if (b < a.batch) splits = max(1LL, (shape(b, false, row_tiles) + chunk - 1) / chunk);
        const int items = (splits + a.tree_apart) * row_tiles;
        int block_items;
        const int first = items_before + block_inclusive_sum(items, scan, &block_items) - items;
        items_before += block_items;
        if (b < a.batch) {
            if (blockIdx.x == 0) a.req_meta[b] = make_int4(first, splits + a.tree_apart, row_tiles, row_tiles);
            const int local = static_cast<int>(blockIdx.x) - first;
            if (0 <= local && local < items) {
                found[0] = b;
                found[1] = local / row_tiles;
                found[2] = splits;
                found[3] = local % row_tiles;
            }
        }
        __syncthreads();
        if (blockIdx.x != 0 && found[0] >= 0) break;
    }
}

// The stamp of a sparse schedule: everything write_sparse_item's choice depends on but qo_indptr.
template <int HEADS, int BM>
__device__ __forceinline__ void sparse_stamp(const SparseArgs& a, int (&w)[STAMP_WORDS]) {
    const int words[STAMP_WORDS] = {STAMP_MARK, a.batch,        a.target_ctas, a.min_chunk, a.max_chunk,    a.max_nodes,
                                    a.total_tokens, a.topk_width, HEADS,         BM,          (int)gridDim.x, a.tree_apart};
#pragma unroll
    for (int i = 0; i < STAMP_WORDS; ++i) w[i] = words[i];
}

// sparse_schedule's CTA blockIdx.x (the grid of the attention kernel it serves): its item into the
// table; CTA 0 also writes the stamp, qo_indptr and req_meta. `a` has validate 0.
template <int HEADS, int BM>
__device__ __forceinline__ void write_sparse_table(SparseArgs a, int* words, ScheduleScratch* sc) {
    const ScheduleTable t{words, a.batch};
    a.req_meta = t.req_meta(gridDim.x);  // CTA 0 writes the table's own copy
    write_sparse_item<HEADS, BM>(a, sc);
    if (threadIdx.x == 0) t.items()[blockIdx.x] = make_int4(sc->found[0], sc->found[1], sc->found[2], sc->found[3]);
    if (blockIdx.x != 0) return;
    if (threadIdx.x == 0) {
        int stamp[STAMP_WORDS];
        sparse_stamp<HEADS, BM>(a, stamp);
#pragma unroll
        for (int i = 0; i < STAMP_WORDS; ++i) words[i] = stamp[i];
    }
    for (int i = threadIdx.x; i <= a.batch; i += blockDim.x) t.lengths()[i] = a.qo_indptr[i];
}

// This CTA's item from the table into sc->found, if the table was made for this call's schedule and
// qo_indptr (take_table_item, as the dense read_schedule_table). The stamp and length checks stay
// apart from the dense ones: one function for both rescheduled the sm_90 plan's dense seesaw
// kernels (783 SASS lines moved, bench/NOTES.md v86), which only a GPU A/B could clear.
template <int HEADS, int BM>
__device__ __noinline__ bool read_sparse_table(const SparseArgs a, const int* table, ScheduleScratch* sc) {
    const ScheduleTable t{const_cast<int*>(table), a.batch};
    const int4 item = t.items()[blockIdx.x];
    bool stale = false;
    if (threadIdx.x == 0) {
        int stamp[STAMP_WORDS];
        sparse_stamp<HEADS, BM>(a, stamp);
#pragma unroll
        for (int i = 0; i < STAMP_WORDS; ++i) stale |= table[i] != stamp[i];
    }
    for (int i = threadIdx.x; i <= a.batch; i += blockDim.x) stale |= t.lengths()[i] != a.qo_indptr[i];
    if (__syncthreads_or(stale)) return false;
    take_table_item(t, item, a.req_meta, sc);
    return true;
}

// This CTA's work item: from the step's schedule table (null: none, the kernel is built without
// the read) where it is current, else found here (and always found here under KGEN_VALIDATE, which
// checks the lengths). Every thread calls it; `scratch` is SCHEDULE_SCRATCH_BYTES. The table's read
// and the search are each out of line, this inline, the item passed through shared memory: one
// function holding both, the read inline, or the search returning the item spilled the sm_120 plan's
// DSA-row union kernel at its 168-register cap (bench/NOTES.md v32, v86).
template <int HEADS, int BM>
__device__ __forceinline__ SparseItem find_sparse_item(const SparseArgs& a, const int* table, void* scratch) {
    ScheduleScratch* sc = static_cast<ScheduleScratch*>(scratch);
    if (table == nullptr || a.validate || !read_sparse_table<HEADS, BM>(a, table, sc)) write_sparse_item<HEADS, BM>(a, sc);
    return found_item(sc);
}

}  // namespace kgen
