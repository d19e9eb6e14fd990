// Where attention's query and key rows come from, and which keys a query row sees: the pieces
// both attention loop designs (attention.cuh for mma.sync, attention_wgmma.cuh for sm_90's wgmma)
// and the kernel bodies (attention_kernels.cuh) share.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

// A row of SGLang's DSA pool (DESIGN §11) of D key dims, the first DV its latent: DV e4m3 bytes,
// one fp32 scale per SCALE_BLOCK latent dims (at DV), then the D - DV rope dims in bf16.
template <int D, int DV>
struct ScaledRow {
    static constexpr int SCALE_BLOCK = 128;                     // latent dims per block scale
    static constexpr int SCALE_OFF = DV;                        // the block scales, after the latent bytes
    static constexpr int ROPE_OFF = DV + DV / SCALE_BLOCK * 4;  // then the bf16 rope
    static constexpr int BYTES = ROPE_OFF + (D - DV) * 2;
};

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
using KeyRows = ContiguousRows<C::KV_ROW>;  // key rows in the cache's format

// A request's prefix in a paged cache of ROW_BYTES rows: token t lives at slot
// page_ids[t / PAGE_SIZE] * PAGE_SIZE + t % PAGE_SIZE. With `validate`, a token outside the
// request's pages or the cache raises bit 2 of the error flag and reads slot 0 instead.
// tile_map (or null): the cache as a tensor map, for producers that copy a tile of rows that share
// a page with one tensor copy (whole_tiles_end).
template <int ROW_BYTES, int PAGE_SIZE_>
struct PagedRows {
    static constexpr int PAGE_SIZE = PAGE_SIZE_;
    const char* kv_cache;
    const int* page_ids;  // this request's pages
    int pages;
    long long num_slots;
    int validate;
    int* error_flag;
    const TileMap* tile_map = nullptr;

    __device__ __forceinline__ int fetch(int t) const { return page_ids[t / PAGE_SIZE]; }
    __device__ __forceinline__ long long slot(int t, int page) const { return (long long)page * PAGE_SIZE + t % PAGE_SIZE; }
    __device__ __forceinline__ const char* row(int t, int page) const {
        long long s = slot(t, page);
        if (validate && (t / PAGE_SIZE >= pages || s < 0 || s >= num_slots)) {
            atomicOr(error_flag, 2);
            s = 0;
        }
        return kv_cache + s * ROW_BYTES;
    }
    // How many leading tiles of `rows` tokens tensor copies may stage whole: every full tile (each
    // lies in one page: callers tile pages exactly, tiles_in_pages), or none without a map or when
    // validating (validate copies row by row, checking each slot).
    __device__ __forceinline__ int whole_tiles(int rows, int num_keys) const {
        return tile_map != nullptr && !validate ? num_keys / rows : 0;
    }
};

// Rows sources whose tiles of `rows` tokens may be copied whole (PagedRows with pages of whole tiles).
template <class Rows, int rows>
constexpr bool tiles_in_pages = false;
template <int ROW_BYTES, int PAGE_SIZE, int rows>
constexpr bool tiles_in_pages<PagedRows<ROW_BYTES, PAGE_SIZE>, rows> = PAGE_SIZE % rows == 0;

// The end of a range's leading whole tiles (tile_begin when none): the producers stage tiles
// [tile_begin, end) with tensor copies and the rest row by row. Computed once per range, uniform
// over the CTA.
template <int BN, class Keys>
__device__ __forceinline__ int whole_tiles_end(const Keys& keys, int num_keys, int tile_begin, int tile_end) {
    if constexpr (tiles_in_pages<Keys, BN>) return max(tile_begin, min(tile_end, keys.whole_tiles(BN, num_keys)));
    else return tile_begin;
}

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

// Set up the ring's barriers (one thread): a stage is full after `full_arrivals` producer
// arrivals (and the bytes they announce), empty after `empty_arrivals` consumer arrivals.
template <class C>
__device__ __forceinline__ void ring_init(char* smem, int full_arrivals, int empty_arrivals) {
    for (int s = 0; s < C::STAGES; ++s) {
        mbar_init(ring_full<C>(smem, s), full_arrivals);
        mbar_init(ring_empty<C>(smem, s), empty_arrivals);
    }
}

// Producer: wait until the stage of ring position `pos` is free (its previous fill consumed); the stage.
template <class C>
__device__ __forceinline__ int ring_wait_free(char* smem, int pos) {
    const int stage = pos % C::STAGES, fill = pos / C::STAGES;
    if (fill > 0) mbar_wait(ring_empty<C>(smem, stage), (fill - 1) & 1);
    return stage;
}

// Consumer: wait until the tile of ring position `pos` has landed; the stage.
template <class C>
__device__ __forceinline__ int ring_wait_full(char* smem, int pos) {
    const int stage = pos % C::STAGES;
    mbar_wait(ring_full<C>(smem, stage), (pos / C::STAGES) & 1);
    return stage;
}

// One tile of a row's online softmax (base 2): the running max takes in the tile's max logit;
// alpha rescales what the row summed so far (its O and running sum), and the tile's logits are
// exponentiated against ref (0 for a row that has seen nothing yet, so no -inf - -inf). With SLACK
// > 0 (FlashAttention-4's conditional rescale) row_max is a reference that moves only when a tile's
// max passes it by more than SLACK: most tiles of a long row then keep alpha = 1, and the loops skip
// O's rescale (warp-uniform); probabilities reach 2^SLACK, which a loop allows only where its P
// holds them (bf16 / f16 P; not e4m3 P scaled by P_SCALE, nor f16 P times block scales). The lse
// (ref + log2 l) is exact either way (bench/NOTES.md v59).
constexpr int BF16_P_SLACK = 8;  // the slack of loops whose P is bf16 or f16 (with or without fp32 scales folded in)
struct SoftmaxStep {
    float alpha, ref;
};
template <int SLACK = 0>
__device__ __forceinline__ SoftmaxStep online_softmax_step(float& row_max, float tile_max) {
    if (SLACK > 0 && !(tile_max > row_max + SLACK)) return {1.f, row_max == neg_inf() ? 0.f : row_max};
    const float new_max = fmaxf(row_max, tile_max);
    const float ref = new_max == neg_inf() ? 0.f : new_max;
    const float alpha = exp2_fast(row_max - ref);
    row_max = new_max;
    return {alpha, ref};
}

// A row's end from its online softmax: the factor that normalizes its O (out_scale / l; 0 for a
// row that saw nothing), and its lse in natural log (-inf for such a row).
__device__ __forceinline__ float row_inv_l(float row_sum, float out_scale) {
    return row_sum == 0.f ? 0.f : out_scale / row_sum;
}
__device__ __forceinline__ float row_lse(float row_max, float row_sum) {
    return row_sum == 0.f ? neg_inf() : (row_max + __log2f(row_sum)) * LN2;
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
