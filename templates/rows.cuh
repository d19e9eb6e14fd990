// Where attention's query and key rows come from, and which keys a query row sees: the pieces
// both attention loop designs (attention.cuh for mma.sync, attention_wgmma.cuh for sm_90's wgmma)
// and the kernel bodies (attention_kernels.cuh) share.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

// A row source (Rows) has fetch(j) -> int, which may read global memory (a page id), and
// row(j, fetched) -> byte pointer, which must not. Producers fetch a tile ahead so that the
// global load is in flight while they wait for a free stage.
struct PendingRow {
    int j;        // row index within the range
    int fetched;  // what Rows::fetch(j) returned
};

// Row `row` of key tile `tile` (BN rows a tile). Rows past the end of the keys repeat the last
// key: they are masked out of the softmax, and a real row keeps NaN/Inf out of P·V.
template <int BN, class Rows>
__device__ __forceinline__ PendingRow fetch_row(int tile, int row, int num_keys, const Rows& rows) {
    const int j = min(tile * BN + row, num_keys - 1);
    return {j, rows.fetch(j)};
}

// Rows of a contiguous [rows, ROW_BYTES] matrix starting at `base` (queries, tree keys).
template <int ROW_BYTES>
struct ContiguousRows {
    const char* base;
    __device__ __forceinline__ int fetch(int) const { return 0; }
    __device__ __forceinline__ const char* row(int j, int) const { return base + (long long)j * ROW_BYTES; }
};

template <class C>
using QueryRows = ContiguousRows<C::D * 2>;  // q rows are bf16
template <class C>
using KeyRows = ContiguousRows<C::D * C::KV_ELEM>;  // key rows in the KV type

// A request's prefix in a paged cache of ROW_BYTES rows: token t lives at slot
// page_ids[t / PAGE_SIZE] * PAGE_SIZE + t % PAGE_SIZE. With `validate`, a token outside the
// request's pages or the cache raises bit 2 of the error flag and reads slot 0 instead.
template <int ROW_BYTES, int PAGE_SIZE>
struct PagedRows {
    const char* kv_cache;
    const int* page_ids;  // this request's pages
    int pages;
    long long num_slots;
    int validate;
    int* error_flag;

    __device__ __forceinline__ int fetch(int t) const { return page_ids[t / PAGE_SIZE]; }
    __device__ __forceinline__ const char* row(int t, int page) const {
        long long slot = (long long)page * PAGE_SIZE + t % PAGE_SIZE;
        if (validate && (t / PAGE_SIZE >= pages || slot < 0 || slot >= num_slots)) {
            atomicOr(error_flag, 2);
            slot = 0;
        }
        return kv_cache + slot * ROW_BYTES;
    }
};

// Every query row sees every key (a prefix).
struct AllVisible {
    static constexpr bool ALL = true;
    __device__ __forceinline__ bool operator()(int, int) const { return true; }
};

// Tree visibility of a request: bit t of row token (word t / 32) says token sees tree token t.
// `mask` points at the request's first row; rows >= num_rows of this CTA are padding.
template <class C, int MASK_WORDS>
struct TreeVisible {
    static constexpr bool ALL = false;
    const unsigned* mask;
    int row_tile, num_rows;
    __device__ __forceinline__ bool operator()(int r, int t) const {
        if (r >= num_rows) return false;  // padding row: its token is not in this request
        const int token = (row_tile * C::BM + r) / C::HEADS;
        return ((mask[token * MASK_WORDS + (t >> 5)] >> (t & 31)) & 1u) != 0;
    }
};

// A loop design's KV ring: STAGES "full" mbarriers (the stage's copies landed) then STAGES
// "empty" ones (its consumers are done with it), from C::BAR_OFF of shared memory.
template <class C>
__device__ __forceinline__ mbarrier* ring_full(char* smem, int stage) {
    return reinterpret_cast<mbarrier*>(smem + C::BAR_OFF) + stage;
}
template <class C>
__device__ __forceinline__ mbarrier* ring_empty(char* smem, int stage) {
    return reinterpret_cast<mbarrier*>(smem + C::BAR_OFF) + C::STAGES + stage;
}

// Key tiles [tile_begin, tile_end) of a range of num_keys keys, and who sees them.
template <class Keys, class Visible>
struct KeyRange {
    Keys keys;
    int num_keys;
    Visible visible;
    int tile_begin, tile_end;
};

// No second key range (prefix-only and tree-only calls).
struct NoKeys {};
template <class R>
constexpr bool is_key_range = true;
template <>
constexpr bool is_key_range<NoKeys> = false;

}  // namespace kgen
