// Split-KV schedule: no host sync (CUDA graphs), so a call is two launches (attention, combine).
// Every attention CTA can find its work item for itself (write_work_item, ~3 us of serial loads,
// divisions and barriers at its start). A prepared step also writes each CTA's item into a
// schedule table once (split_schedule, a launch of its own when the step first runs a kernel and
// on Step.reschedule()); an attention CTA takes its item from the table when the table's stamp
// (the schedule's parameters and a copy of the lengths it was made from) matches the call's, and
// finds it for itself otherwise, so a stale table costs time, never correctness.
//
// Request b has mt_b = ceil(T_b*H/BM) row tiles (rounded up to whole groups of GROUP: the CTAs of a
// cluster) and nt_b = ceil(L_b/BN) KV tiles; all requests'
// work is W = sum mt_b*nt_b tiles. A chunk c gives request b s_b = max(min_splits, ceil(nt_b/c))
// splits of equal size ceil(nt_b/s_b) (the last may be shorter); its work items are (split, row
// tile) pairs, row tile fastest, so the CTAs that share a KV chunk run side by side and the chunk
// is read from DRAM once (halving, below, cuts other splits). CTA i does item i; CTAs past the
// last item have none. min_splits = 1 gives a request with no prefix one (empty) split all the
// same: verify_attn does its tree in the last split, and tree_attn (all kv_lens 0) gets one item
// per row tile.
//
// The chunk: the CTAs run in waves of target_ctas, so a call takes about ceil(items/target) waves,
// each as long as the longest item (its tiles plus min_split_tiles for its start and its partial
// state). The schedule weighs 1 + 2 waves chunks — no split; and for w = 1 .. waves,
// max(min_split_tiles, ceil(W/(w target))) and that chunk rounded up to cut the longest request
// into equal splits — and takes the first whose waves end first (kgen/splitkv.py has its copy).
// waves = SPLIT_WAVES where the call's row tiles could fill more than a wave (R = ceil(total tokens
// H / BM) + batch GROUP > target: rows alone cannot balance one wave), else 1, so a call of fewer rows
// launches no more than one wave of CTAs that find no item. The grid: waves target + R, in whole
// groups.
//
// Halving (where waves > 1): equal splits leave the last wave part-empty (144 row tiles on 132 SMs in
// 4 splits are 4.36 waves, run as 5). Cut instead every request's n KV tiles into `levels` pieces of
// halving size — level j < levels - 1 is [n - (n >> j), n - (n >> (j + 1))), the last [n - (n >>
// (levels - 1)), n) — and run the items level-major (all requests' row tiles at level 0, then level
// 1, ..): the CTAs start in index order on the SM that frees first, so the small pieces at the end
// fill the waves' tail (list scheduling). Weighed for levels 2 .. MAX_LEVELS where every request has
// at least min_split_tiles << (levels - 1) KV tiles and (levels - 1) R <= waves target (the items fit
// the grid), at max(ceil((W + items min_split_tiles) / target) + (n_max >> (levels - 1)), ceil(n_max
// / 2)) + min_split_tiles, and taken where that is below the best chunk's cost (bench/NOTES.md v65).
//
//   req_meta[b] = (first item, splits, stride, row tiles), written by CTA 0 for the combine kernel:
//   split s of row tile r is item first + s stride + r (stride: the request's row tiles for equal
//   splits, all requests' for halving); the partial state of item i is slot i of part_o / part_lse.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

struct RequestShape {
    int tokens, keys, row_tiles, kv_tiles;
};

// Lengths are clamped to what the kernels can index; `report` flags the bad ones (KGEN_VALIDATE).
// Row tiles come in whole groups of GROUP (a cluster's CTAs; the last tiles of a group may be pads).
template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ RequestShape request_shape(const int* qo_indptr, const int* kv_lens, int b, int max_nodes,
                                                      bool report, int* error_flag) {
    int tokens = qo_indptr[b + 1] - qo_indptr[b];
    int keys = kv_lens[b];
    if (tokens < 0 || tokens > max_nodes || keys < 0) {
        if (report) atomicOr(error_flag, 1);
        tokens = min(max(tokens, 0), max_nodes);
        keys = max(keys, 0);
    }
    const int row_tiles = ((tokens * HEADS + BM - 1) / BM + GROUP - 1) / GROUP * GROUP;
    return {tokens, keys, row_tiles, (keys + BN - 1) / BN};
}

// Inclusive block-wide sum of one int per thread; returns it and the block total in *total.
__device__ __forceinline__ int block_inclusive_sum(int v, int* scratch, int* total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_inclusive_sum(v);
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) scratch[lane] = warp_inclusive_sum(lane < warps ? scratch[lane] : 0);  // of the warp totals
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
    const int* table;  // a schedule table (ScheduleTable), or nullptr: every CTA finds its item
};

constexpr int SPLIT_WAVES = 4, CHUNK_CANDIDATES = 2 * SPLIT_WAVES + 1;  // kgen/splitkv.py's SPLIT_WAVES
constexpr int MAX_LEVELS = 4;  // halving's most levels (kgen/splitkv.py's)

// The waves of CTAs the call's chunks may fill (kgen/splitkv.py's waves_of).
template <int HEADS, int BM, int GROUP>
__device__ __forceinline__ int split_waves(const ScheduleArgs& a) {
    const long long row_tile_bound = ((long long)a.total_tokens * HEADS + BM - 1) / BM + (long long)a.batch * GROUP;
    return row_tile_bound <= a.target_ctas ? 1 : SPLIT_WAVES;
}

// Candidate k of the chunks the schedule weighs (the order of kgen/splitkv.py's chunk_candidates).
// A chunk beyond the longest request is no split: clamped to it, so it fits an int.
__device__ __forceinline__ int chunk_candidate(int k, unsigned long long work, int longest, const ScheduleArgs& a) {
    const int unsplit = max(a.min_split_tiles, longest);
    if (k == 0) return unsplit;
    const unsigned long long slots = (unsigned long long)((k + 1) / 2) * a.target_ctas;
    const int chunk = (int)min((unsigned long long)unsplit, max((unsigned long long)a.min_split_tiles,
                                                                (work + slots - 1) / slots));
    if (k % 2) return chunk;
    const int splits = max(1, longest / chunk);  // of the longest request, equal ones
    return max(a.min_split_tiles, (longest + splits - 1) / splits);
}

struct Splits {
    int count, tiles;  // a request's splits, and the KV tiles of each (the last may have fewer)
};

__device__ __forceinline__ Splits splits_of(int kv_tiles, int chunk, int min_splits) {
    const int count = max(min_splits, (kv_tiles + chunk - 1) / chunk);
    return {count, count ? (kv_tiles + count - 1) / count : 0};
}

// How a call's requests are split: equal splits of at most `chunk` KV tiles (levels 0), or halving
// into `levels` pieces.
struct SplitRule {
    int chunk, levels;
};

// KV tiles [begin, end) of request piece `level` of a halving into `levels` (n KV tiles).
__device__ __forceinline__ int halving_begin(int n, int level) { return n - (n >> level); }
__device__ __forceinline__ int halving_end(int n, int level, int levels) {
    return level + 1 < levels ? n - (n >> (level + 1)) : n;
}

struct Weighed {
    int chunk, items, split_tiles;  // a chunk candidate, its work items, the KV tiles of the longest
};

// The schedule's shared-memory scratch: SCHEDULE_SCRATCH_BYTES at a loop design's SCRATCH_OFF.
struct ScheduleScratch {
    int scan[32];  // block_inclusive_sum's warp totals; block_reduce's per-warp maxima
    union {
        unsigned long long sums[32];  // block_reduce's per-warp sums of the work
        Weighed weighed[16];          // then per chunk candidate
    };
    int found[4];  // this CTA's WorkItem (request, row tile, first and end KV tile)
};
constexpr int SCHEDULE_SCRATCH_BYTES = sizeof(ScheduleScratch);
static_assert(SCHEDULE_SCRATCH_BYTES == 400 && alignof(ScheduleScratch) == 8, "the scratch layout");
static_assert(CHUNK_CANDIDATES <= 16, "a weighed slot per candidate");

// The split rule whose waves of work items end first: the chunk candidates' (the first such), then
// halving where it ends before. Each warp weighs chunk candidates warp, warp + warps, ..: its lanes go
// through the requests. work: W; rows: R, the requests' row tiles; longest / shortest: KV tiles.
template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ SplitRule choose_split(const ScheduleArgs& a, unsigned long long work, int longest,
                                                  int shortest, int rows, ScheduleScratch* sc) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int waves = split_waves<HEADS, BM, GROUP>(a), candidates = 1 + 2 * waves;
    for (int k = warp; k < candidates; k += warps) {
        const int chunk = chunk_candidate(k, work, longest, a);
        int items = 0, split_tiles = 0;
        for (int b = lane; b < a.batch; b += 32) {
            const RequestShape r = request_shape<HEADS, BM, BN, GROUP>(a.qo_indptr, a.kv_lens, b, a.max_nodes, false,
                                                                a.error_flag);
            const Splits s = splits_of(r.kv_tiles, chunk, a.min_splits);
            items += s.count * r.row_tiles;
            split_tiles = max(split_tiles, s.tiles);
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            items += __shfl_xor_sync(0xffffffffu, items, off);
            split_tiles = max(split_tiles, __shfl_xor_sync(0xffffffffu, split_tiles, off));
        }
        if (lane == 0) sc->weighed[k] = {chunk, items, split_tiles};
    }
    __syncthreads();
    long long best = -1;
    SplitRule rule{0, 0};
    for (int k = 0; k < candidates; ++k) {
        const Weighed w = sc->weighed[k];
        const int waves_run = (w.items + a.target_ctas - 1) / a.target_ctas;
        const long long cost = (long long)waves_run * (w.split_tiles + a.min_split_tiles);
        if (best < 0 || cost < best) {
            best = cost;
            rule.chunk = w.chunk;
        }
    }
    __syncthreads();  // the scratch may be reused
    for (int levels = 2; waves > 1 && levels <= MAX_LEVELS; ++levels) {
        if (shortest < a.min_split_tiles << (levels - 1) || (long long)(levels - 1) * rows > (long long)waves * a.target_ctas)
            break;
        const long long items = (long long)levels * rows;
        const long long filled = ((long long)work + items * a.min_split_tiles + a.target_ctas - 1) / a.target_ctas;
        const long long cost = max(filled + (longest >> (levels - 1)), (long long)longest - (longest >> 1)) + a.min_split_tiles;
        if (cost < best) {
            best = cost;
            rule.levels = levels;
        }
    }
    return rule;
}

// Writes this CTA's work item to sc->found (find_work_item below). Not inlined: it runs once per
// CTA, and out of line its temporaries stay out of the attention loop's register allocation
// (inlined, the fp8 verify kernel for sm_90 spilled a register at the 168-register cap); it returns
// nothing, so the registers ptxas would return the item in cannot crowd the loop either (returned,
// they cost the sm_120 DSA-row verify kernel a spilled register).
template <int HEADS, int BM, int BN, int GROUP>
__device__ __noinline__ void write_work_item(const ScheduleArgs a, ScheduleScratch* sc) {
    int* scan = sc->scan;
    int* found = sc->found;
    const bool report = a.validate && blockIdx.x == 0;  // one CTA reports bad lengths
    if (threadIdx.x == 0) {
        found[0] = -1;
        if (report && (a.qo_indptr[0] != 0 || a.qo_indptr[a.batch] != a.total_tokens)) atomicOr(a.error_flag, 1);
    }
    unsigned long long mine = 0;
    int longest = 0, shortest = 0x7fffffff, rows = 0;  // KV tiles of the longest and shortest request; R
    for (int b = threadIdx.x; b < a.batch; b += blockDim.x) {
        const RequestShape r = request_shape<HEADS, BM, BN, GROUP>(a.qo_indptr, a.kv_lens, b, a.max_nodes, report, a.error_flag);
        mine += (unsigned long long)r.row_tiles * r.kv_tiles;
        longest = max(longest, r.kv_tiles);
        shortest = min(shortest, r.kv_tiles);
        rows += r.row_tiles;
    }
    const unsigned long long total_work = block_reduce<Sum>(mine, sc->sums);
    longest = block_reduce<Max>(longest, scan);
    if (split_waves<HEADS, BM, GROUP>(a) > 1) {  // only then is halving weighed, and these read
        shortest = -block_reduce<Max>(-shortest, scan);
        rows = block_reduce<Sum>(rows, scan);
    }
    const SplitRule rule = choose_split<HEADS, BM, BN, GROUP>(a, total_work, longest, shortest, rows, sc);

    // Requests in blocks of blockDim.x: a scan of their item counts (halving: of their row tiles, the
    // items of one level) finds the request holding item blockIdx.x. CTA 0 goes through all of them
    // to write req_meta.
    const int level = rule.levels ? blockIdx.x / max(rows, 1) : 0;
    const int wanted = !rule.levels ? blockIdx.x : level < rule.levels ? blockIdx.x % rows : -1;
    int items_before = 0;
    for (int base = 0; base < a.batch; base += blockDim.x) {
        const int b = base + threadIdx.x;
        RequestShape r{};
        Splits splits{0, 0};
        if (b < a.batch) {
            r = request_shape<HEADS, BM, BN, GROUP>(a.qo_indptr, a.kv_lens, b, a.max_nodes, false, a.error_flag);
            splits = rule.levels ? Splits{rule.levels, 0} : splits_of(r.kv_tiles, rule.chunk, a.min_splits);
        }
        const int items = rule.levels ? r.row_tiles : splits.count * r.row_tiles;
        int block_items;
        const int first = items_before + block_inclusive_sum(items, scan, &block_items) - items;
        items_before += block_items;
        if (b < a.batch) {
            if (blockIdx.x == 0) a.req_meta[b] = make_int4(first, splits.count, rule.levels ? rows : r.row_tiles, r.row_tiles);
            const int local = wanted - first;
            if (0 <= local && local < items) {  // this thread's request holds the CTA's item
                found[0] = b;
                found[1] = local % r.row_tiles;
                if (rule.levels) {
                    found[2] = halving_begin(r.kv_tiles, level);
                    found[3] = halving_end(r.kv_tiles, level, rule.levels);
                } else {
                    const int begin = (local / r.row_tiles) * splits.tiles;
                    found[2] = begin;
                    found[3] = min(r.kv_tiles, begin + splits.tiles);
                }
            }
        }
        __syncthreads();  // found[] is complete and the same for every thread
        if (blockIdx.x != 0 && found[0] >= 0) break;
    }
}

// A schedule table, in int32 words (kgen/step.py's table_bytes has its size): a stamp of
// STAMP_WORDS (STAMP_MARK, then the schedule's parameters), the lengths it was made from
// (qo_indptr[0..batch], kv_lens[0..batch)), then from a 16-byte boundary each CTA's item and
// each request's req_meta.
constexpr int STAMP_WORDS = 12, STAMP_MARK = 0x6b67656e;  // "kgen"

struct ScheduleTable {
    static __device__ __forceinline__ int items_word(int batch) { return (STAMP_WORDS + 2 * batch + 1 + 3) / 4 * 4; }
    int* words;
    int batch;
    __device__ __forceinline__ int* lengths() const { return words + STAMP_WORDS; }
    __device__ __forceinline__ int4* items() const { return reinterpret_cast<int4*>(words + items_word(batch)); }
    __device__ __forceinline__ int4* req_meta(int grid) const { return items() + grid; }
};

// A table found current: this CTA's item into sc->found; CTA 0 also copies the table's req_meta
// for the combine (read_schedule_table, read_sparse_table).
__device__ __forceinline__ void take_table_item(const ScheduleTable& t, int4 item, int4* req_meta, ScheduleScratch* sc) {
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < t.batch; i += blockDim.x) req_meta[i] = t.req_meta(gridDim.x)[i];
    if (threadIdx.x == 0) {
        sc->found[0] = item.x;
        sc->found[1] = item.y;
        sc->found[2] = item.z;
        sc->found[3] = item.w;
    }
    __syncthreads();
}

// The stamp of a schedule: everything find_work_item's choice depends on but the lengths.
template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ void stamp_of(const ScheduleArgs& a, int (&w)[STAMP_WORDS]) {
    const int words[STAMP_WORDS] = {STAMP_MARK, a.batch, a.target_ctas, a.min_split_tiles, a.min_splits,
                                    a.max_nodes, a.total_tokens, HEADS, BM | GROUP << 16, BN, (int)gridDim.x, SPLIT_WAVES};
#pragma unroll
    for (int i = 0; i < STAMP_WORDS; ++i) w[i] = words[i];
}

// split_schedule's CTA blockIdx.x: its item into the table; CTA 0 also writes the stamp, the
// lengths and req_meta. `a` has validate 0.
template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ void write_schedule_table(ScheduleArgs a, int* words, ScheduleScratch* sc) {
    const ScheduleTable t{words, a.batch};
    a.req_meta = t.req_meta(gridDim.x);  // CTA 0 writes the table's own copy
    write_work_item<HEADS, BM, BN, GROUP>(a, sc);
    if (threadIdx.x == 0) t.items()[blockIdx.x] = make_int4(sc->found[0], sc->found[1], sc->found[2], sc->found[3]);
    if (blockIdx.x != 0) return;
    if (threadIdx.x == 0) {
        int stamp[STAMP_WORDS];
        stamp_of<HEADS, BM, BN, GROUP>(a, stamp);
#pragma unroll
        for (int i = 0; i < STAMP_WORDS; ++i) words[i] = stamp[i];
    }
    for (int i = threadIdx.x; i <= a.batch; i += blockDim.x) t.lengths()[i] = a.qo_indptr[i];
    for (int i = threadIdx.x; i < a.batch; i += blockDim.x) t.lengths()[a.batch + 1 + i] = a.kv_lens[i];
}

// This CTA's item from the table into sc->found, if the table was made for this call's schedule
// and lengths; CTA 0 then copies the table's req_meta for the combine.
template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ bool read_schedule_table(const ScheduleArgs& a, ScheduleScratch* sc) {
    const ScheduleTable t{const_cast<int*>(a.table), a.batch};
    const int4 item = t.items()[blockIdx.x];
    bool stale = false;
    if (threadIdx.x == 0) {
        int stamp[STAMP_WORDS];
        stamp_of<HEADS, BM, BN, GROUP>(a, stamp);
#pragma unroll
        for (int i = 0; i < STAMP_WORDS; ++i) stale |= a.table[i] != stamp[i];
    }
    for (int i = threadIdx.x; i <= a.batch; i += blockDim.x) stale |= t.lengths()[i] != a.qo_indptr[i];
    for (int i = threadIdx.x; i < a.batch; i += blockDim.x) stale |= t.lengths()[a.batch + 1 + i] != a.kv_lens[i];
    if (__syncthreads_or(stale)) return false;
    take_table_item(t, item, a.req_meta, sc);
    return true;
}

// This CTA's work item. Every thread of the CTA calls it; `scratch` is SCHEDULE_SCRATCH_BYTES of
// shared memory (8-byte aligned) that the caller does not use until the call returns. A KGEN_VALIDATE
// call finds its item for itself, so that its lengths are checked.
// Out of line for the reason write_work_item is: one call from the attention kernel.
template <int HEADS, int BM, int BN, int GROUP>
__device__ __noinline__ void find_work_item_into(const ScheduleArgs a, ScheduleScratch* sc) {
    if (a.table == nullptr || a.validate || !read_schedule_table<HEADS, BM, BN, GROUP>(a, sc))
        write_work_item<HEADS, BM, BN, GROUP>(a, sc);
}

template <int HEADS, int BM, int BN, int GROUP>
__device__ __forceinline__ WorkItem find_work_item(const ScheduleArgs& a, void* scratch) {
    ScheduleScratch* sc = static_cast<ScheduleScratch*>(scratch);
    find_work_item_into<HEADS, BM, BN, GROUP>(a, sc);
    const int* found = sc->found;
    return {found[0], found[1], found[2], found[3]};
}

}  // namespace kgen
