// The KV ring of the sm_90 loops (attention_wgmma.cuh, attention_seesaw.cuh): BM = 64 query rows, a
// producer warpgroup (threads 0..127) that stages each tile of BN key rows into a STAGES-deep ring of
// 128-byte-swizzled column blocks (D/64 blocks of SLAB = BN x 128 bytes a stage), and the pieces two
// consumer warpgroups read it with (their coordinates, wgmma descriptors, the stage's release).
// bf16 rows are copied; fp8 rows go through two raw stages that the producer converts, exactly.
#pragma once
#include "kgen/rows.cuh"
#include "kgen/wgmma_ptx.cuh"

namespace kgen {

// What the ring's producer and both sm_90 loops' consumers read of a loop's Config: the shapes (BM
// = 64 query rows, BN key rows a tile, STAGES), the KV row format and the three warpgroups' registers.
// A loop's Config derives from it and from its Layout (kgen/designs/: SLAB, STAGE_BYTES, the raw
// stages, the block scales).
template <int HEADS_, int D_, int DV_, int BN_, int STAGES_, bool KV_FP8_, bool KV_SCALED_, class Layout>
struct WgRing : Layout {
    static constexpr int HEADS = HEADS_, D = D_, DV = DV_, BM = 64, BN = BN_, STAGES = STAGES_;
    static constexpr int CLUSTER = 1;  // CTAs a cluster: none
    static constexpr bool KV_FP8 = KV_FP8_;        // e4m3 rows, converted into the bf16 ring by the producer
    static constexpr bool KV_SCALED = KV_SCALED_;  // the DSA pool's rows: per-block scales, bf16 rope
    using Row = ScaledRow<D, DV>;
    static constexpr int KV_ROW = KV_SCALED ? Row::BYTES : KV_FP8 ? D : D * 2;  // bytes per KV row in the cache
    static constexpr int THREADS = 3 * 128;   // producer warpgroup, two consumer warpgroups
    static constexpr int CONSUMER_WARPS = 8;
    static constexpr int WG_DV = DV / 2;      // value (latent) dims per consumer
    static constexpr int BLOCK_STEPS = Row::SCALE_BLOCK / 16;  // k-steps per scale block (DSA rows)
    static constexpr int ROW_CHUNKS = D * 2 / 16;  // 16-byte chunks of a staged (bf16) row
    // A raw stage's rows: the e4m3 bytes the producer converts (DSA rows: the latent; their scales
    // and rope are copied straight to the ring stage)
    static constexpr int RAW_ROW = KV_SCALED ? DV : KV_ROW;
    static constexpr int RAW_CHUNKS = RAW_ROW / 16;
    static constexpr int ROW_THREADS = 128 / BN;   // producer threads per staged row
    // 128 * P + 256 * C <= 384 * 168 (else setmaxnreg.inc waits forever for registers the CTA does
    // not have). fp8 rows: the producer's conversion is latency-bound with 24 (two chunks in flight);
    // 40 bought the DSA rows 6-8% though the consumers spill a few words at 232.
    static constexpr int PRODUCER_REGS = KV_FP8 ? 40 : 24, CONSUMER_REGS = KV_FP8 ? 232 : 240;
    static constexpr int MAX_SLACK = BF16_P_SLACK;  // the online softmax's slack (rows.cuh): bf16 P, times scales
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * 168, "the warpgroups' registers fit the CTA's");

    static_assert(128 % BN == 0 && ROW_CHUNKS % ROW_THREADS == 0 && RAW_CHUNKS % ROW_THREADS == 0 && KV_ROW % 16 == 0,
                  "producer layout");
    static_assert(Layout::SLAB == BN * 128 && Layout::STAGE_BYTES == (D / 64) * Layout::SLAB &&
                      Layout::STAGE_BYTES % 1024 == 0,
                  "swizzled tiles of 128-byte rows start 1024-byte aligned");
    static constexpr int PRODUCER_BAR = 7;  // named barrier of the 128 producer threads (fp8 rows' raw stages)
    static_assert(Layout::SMEM_BYTES >= Layout::BAR_OFF + (2 * STAGES + (KV_FP8 ? 2 : 0)) * 8 + 1023,
                  "barriers and alignment slack fit");
    static_assert(!KV_SCALED || (KV_FP8 && Row::SCALE_OFF % 16 == 0 && Row::ROPE_OFF == Row::SCALE_OFF + 16 &&
                                 Row::ROPE_OFF % 16 == 0),
                  "DSA rows: the 4 scales are one 16-byte chunk, the rope after (copy_row_rest)");
    // A tile of consecutive slots (kgen/designs/wgmma.py ring_tile_box): bf16 rows, one tensor copy
    // per column block, its 128-byte swizzle the ring's (sw128_offset), each block 1024-byte aligned;
    // fp8 rows, one copy of the tile's raw bytes into a raw stage, RAW_ROW bytes a row, unswizzled.
    static constexpr bool tile_box_ok(int rows, int box_bytes, bool swizzled) {
        return rows == BN && (KV_FP8 ? box_bytes == RAW_ROW && !swizzled : box_bytes == 128 && swizzled);
    }
};

// ---- fp8 rows: raw stages and their conversion into the bf16 ring ----

// The 4 e4m3 values of v (byte 0 first) as two bf16x2 words: e4m3 -> f16 -> f32 -> bf16, each
// step exact (e4m3 has 3 mantissa bits). Not e4m3x4_to_f16x4's in-place form: on sm_90 that frees
// the producer a shift a word but makes ptxas spill the seesaw consumers (bench/NOTES.md v73, v78).
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(unsigned v) {
    const unsigned lo = e4m3x2_to_f16x2(v), hi = e4m3x2_to_f16x2(v >> 16);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return {pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y)};
}

// 16 bytes of bf16 (dims 8 * chunk .. + 7 of a row) at their place in a swizzled stage.
template <class C>
__device__ __forceinline__ char* stage_chunk(char* stage, int row, int chunk) {
    return stage + (chunk / 8) * C::SLAB + sw128_offset(row, chunk % 8);
}

// A raw stage holds BN rows of e4m3 bytes. Producer thread `sub` of row `row` copies the row's
// 16-byte chunks sub, sub + ROW_THREADS, ... into it and converts the same chunks, so every raw
// byte a producer thread reads it copied itself and the producers never wait for each other.
// (src is made opaque first: otherwise the compiler folds the row's slot * KV_ROW into every
// chunk's address, keeps a 64-bit offset per chunk live and spills the producer.)
template <class C>
__device__ __forceinline__ void copy_raw_row(char* raw_stage, const char* src, int row, int sub) {
    char* raw = raw_stage + row * C::RAW_ROW + sub * 16;
    src += sub * 16;
    asm("" : "+l"(src));  // then constant offsets: one address a row
#pragma unroll
    for (int i = 0; i < C::RAW_CHUNKS / C::ROW_THREADS; ++i)
        cp_async16(raw + i * C::ROW_THREADS * 16, src + i * C::ROW_THREADS * 16);
}

// A ring stage's block scales (DSA rows): [BN][4] fp32, each key's as its row stores them.
template <class C>
__device__ __forceinline__ float* stage_scales(char* smem, int stage) {
    return reinterpret_cast<float*>(smem + C::SCALE_OFF) + stage * C::BN * (C::DV / C::Row::SCALE_BLOCK);
}

// DSA rows: the rest of the row straight into ring stage `stage`: its bf16 rope chunks to their
// place (thread sub takes chunks sub, sub + ROW_THREADS, ...) and, by thread 0 of the row, its
// 4 block scales.
template <class C>
__device__ __forceinline__ void copy_row_rest(char* smem, int stage, const char* src, int row, int sub) {
    constexpr int ROPE_CHUNKS = (C::D - C::DV) * 2 / 16;
    static_assert(ROPE_CHUNKS % C::ROW_THREADS == 0, "rope chunks per producer thread");
    char* dst = smem + stage * C::STAGE_BYTES;
#pragma unroll
    for (int k = sub; k < ROPE_CHUNKS; k += C::ROW_THREADS)
        cp_async16(stage_chunk<C>(dst, row, C::DV / 8 + k), src + C::Row::ROPE_OFF + k * 16);
    if (sub == 0) cp_async16(stage_scales<C>(smem, stage) + row * 4, src + C::Row::SCALE_OFF);
}

// The e4m3 chunks of a raw row into the ring as bf16.
template <class C>
__device__ __forceinline__ void convert_row(const char* raw_stage, char* stage, int row, int sub) {
    const char* raw = raw_stage + row * C::RAW_ROW;
#pragma unroll 4  // chunks in flight: the conversion's latency is what the consumers wait for
    for (int c = sub; c < C::RAW_CHUNKS; c += C::ROW_THREADS) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + c * 16);
        const uint2 a = e4m3x4_to_bf16x4(v.x), b = e4m3x4_to_bf16x4(v.y);
        const uint2 d = e4m3x4_to_bf16x4(v.z), e = e4m3x4_to_bf16x4(v.w);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c)) = make_uint4(a.x, a.y, b.x, b.y);
        *reinterpret_cast<uint4*>(stage_chunk<C>(stage, row, 2 * c + 1)) = make_uint4(d.x, d.y, e.x, e.y);
    }
}

// fp8 rows: raw stage r's barrier, after the ring's: a tensor copy of a whole tile's raw bytes landed.
template <class C>
__device__ __forceinline__ mbarrier* raw_full(char* smem, int r) {
    return ring_full<C>(smem, 0) + 2 * C::STAGES + r;
}

// Tile `tile`'s converted rows into the ring stage the consumers freed, from raw stage `raw`;
// fenced for wgmma's reads (async proxy), then the thread arrives. DSA rows: first the rest of the
// rows is copied into the stage, and a cp.async arrival on its barrier (tracking those copies)
// counts too; `then` runs between those copies and the conversion.
template <class C, class Src, class Then>
__device__ __forceinline__ void convert_tile(char* smem, int ring_pos, const char* raw, const Src& src, int tile,
                                             int row, int sub, const Then& then) {
    const int stage = ring_wait_free<C>(smem, ring_pos);
    if constexpr (C::KV_SCALED) {  // the row's address again (its page id is in L1): fewer live registers
        copy_row_rest<C>(smem, stage, src(tile), row, sub);
        cp_async_arrive(ring_full<C>(smem, stage));
    }
    then();
    convert_row<C>(raw, smem + stage * C::STAGE_BYTES, row, sub);
    fence_async_shared();
    mbar_arrive(ring_full<C>(smem, stage));
}

// The producer over fp8 rows. A range's leading whole tiles (rows of consecutive slots in one page:
// whole_tiles_end) land in the raw stages by one tensor copy each, issued by thread 0 two tiles ahead
// of the conversion, once every producer thread has converted the stage's previous tile (fill n of
// the kernel, counted in raw_fills, uses raw stage n % 2); the producer threads issue no copies of
// their own but the DSA rows' rope and scales. The other tiles: each thread copies its own chunks of
// tile t + 1's raw rows while it converts tile t (every raw byte it reads it copied itself).
template <class C, class Keys>
__device__ __forceinline__ void wg_produce_fp8(char* smem, int& ring_pos, int& raw_fills, const Keys& keys,
                                               int num_keys, int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row = threadIdx.x / C::ROW_THREADS, sub = threadIdx.x % C::ROW_THREADS;
    auto raw_stage = [&](int r) { return smem + C::RAW_OFF + (r % 2) * C::RAW_STAGE_BYTES; };
    auto src = [&](int tile) {
        const PendingRow p = fetch_row<C::BN>(tile, row, num_keys, keys);
        return keys.row(p.j, p.fetched);
    };
    int tile = tile_begin;
    if constexpr (tiles_in_pages<Keys, C::BN>) {
        const int whole_end = whole_tiles_end<C::BN>(keys, num_keys, tile_begin, tile_end);
        const int fill0 = raw_fills - tile_begin;  // tile t's fill: fill0 + t
        auto copy_whole = [&](int t) {  // thread 0
            const PendingRow first = fetch_row<C::BN>(t, 0, num_keys, keys);
            mbarrier* bar = raw_full<C>(smem, (fill0 + t) % 2);
            mbar_arrive_expect_tx(bar, C::BN * C::RAW_ROW);
            tile_copy(raw_stage(fill0 + t), keys.tile_map, 0, (int)keys.slot(first.j, first.fetched), bar);
        };
        if (tile < whole_end) {
            named_barrier(C::PRODUCER_BAR, 128);  // an earlier range's conversions are done with the raw stages
            if (threadIdx.x == 0)
                for (int t = tile; t < min(tile + 2, whole_end); ++t) copy_whole(t);
        }
        for (; tile < whole_end; ++tile, ++ring_pos) {
            const int fill = fill0 + tile;
            mbar_wait(raw_full<C>(smem, fill % 2), (fill / 2) & 1);
            convert_tile<C>(smem, ring_pos, raw_stage(fill), src, tile, row, sub, [] {});
            if (tile + 2 < whole_end) {
                named_barrier(C::PRODUCER_BAR, 128);  // raw stage fill % 2 is read: tile + 2 may land there
                if (threadIdx.x == 0) copy_whole(tile + 2);
            }
        }
        raw_fills = fill0 + whole_end;
        if (tile >= tile_end) return;
    }
    copy_raw_row<C>(raw_stage(tile), src(tile), row, sub);
    for (; tile < tile_end; ++tile, ++ring_pos) {
        cp_async_wait_all();  // this thread's copies of tile
        if constexpr (!C::KV_SCALED)
            if (tile + 1 < tile_end) copy_raw_row<C>(raw_stage(tile + 1), src(tile + 1), row, sub);
        convert_tile<C>(smem, ring_pos, raw_stage(tile), src, tile, row, sub, [&] {
            if constexpr (C::KV_SCALED)
                if (tile + 1 < tile_end) copy_raw_row<C>(raw_stage(tile + 1), src(tile + 1), row, sub);
        });
    }
}

// Producer thread p (of 128) stages 16-byte chunks sub, sub + ROW_THREADS, ... of row p / ROW_THREADS
// of every tile of the range, as soon as the consumers free a stage. A tile of consecutive slots
// (whole_tiles_end) is one tensor copy per column block instead, issued by row 0's first thread
// (the others only arrive: the barrier counts every producer thread either way).
template <class C, class Keys>
__device__ __forceinline__ void wg_produce(char* smem, int& ring_pos, const Keys& keys, int num_keys, int tile_begin,
                                           int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row = threadIdx.x / C::ROW_THREADS, sub = threadIdx.x % C::ROW_THREADS;
    const int whole_end = whole_tiles_end<C::BN>(keys, num_keys, tile_begin, tile_end);
    PendingRow next = fetch_row<C::BN>(tile_begin, row, num_keys, keys);
    for (int tile = tile_begin; tile < tile_end; ++tile, ++ring_pos) {
        const PendingRow cur = next;
        if (tile + 1 < tile_end) next = fetch_row<C::BN>(tile + 1, row, num_keys, keys);
        const int stage = ring_wait_free<C>(smem, ring_pos);
        if constexpr (tiles_in_pages<Keys, C::BN>) {
            if (tile < whole_end) {
                if (threadIdx.x == 0) {
                    mbar_arrive_expect_tx(ring_full<C>(smem, stage), C::BN * C::ROW_CHUNKS * 16);
                    const int y = (int)keys.slot(cur.j, cur.fetched);
#pragma unroll
                    for (int b = 0; b < C::ROW_CHUNKS / 8; ++b)  // 128-byte column blocks: 16 8-byte elements
                        tile_copy(smem + stage * C::STAGE_BYTES + b * C::SLAB, keys.tile_map, 16 * b, y,
                                  ring_full<C>(smem, stage));
                } else {
                    mbar_arrive(ring_full<C>(smem, stage));
                }
                continue;
            }
        }
        const char* src = keys.row(cur.j, cur.fetched);
        char* dst = smem + stage * C::STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < C::ROW_CHUNKS / C::ROW_THREADS; ++i) {
            const int chunk = sub + i * C::ROW_THREADS;
            cp_async16(dst + (chunk / 8) * C::SLAB + sw128_offset(row, chunk % 8), src + chunk * 16);
        }
        cp_async_arrive(ring_full<C>(smem, stage));
    }
}

// The sm_90 loops' start (every thread): the dynamic shared memory base aligned up to 1 KB for the
// swizzle, and the ring's barriers (a stage is full after `full_arrivals` producer arrivals, empty
// after every consumer warp's).
template <class C>
__device__ __forceinline__ char* wg_setup(char* smem_raw, int full_arrivals) {
    char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
    if (threadIdx.x == 0) {
        ring_init<C>(smem, full_arrivals, C::CONSUMER_WARPS);
        if constexpr (C::KV_FP8)
            for (int r = 0; r < 2; ++r) mbar_init(raw_full<C>(smem, r), 1);  // thread 0's expect_tx
        mbar_init_fence();
    }
    __syncthreads();
    return smem;
}

// The producer warpgroup's part of attend(): the tiles of `first`, then of the range second_fn()
// returns (NoKeys: none), into the ring; it gives its registers to the consumers first.
template <class C, class First, class SecondFn>
__device__ __forceinline__ void wg_producer(char* smem, const First& first, const SecondFn& second_fn) {
    setmaxnreg_dec<C::PRODUCER_REGS>();
    int ring_pos = 0, raw_fills = 0;
    auto produce = [&](const auto& range) {
        if constexpr (C::KV_FP8)
            wg_produce_fp8<C>(smem, ring_pos, raw_fills, range.keys, range.num_keys, range.tile_begin, range.tile_end);
        else
            wg_produce<C>(smem, ring_pos, range.keys, range.num_keys, range.tile_begin, range.tile_end);
    };
    produce(first);
    const auto second = second_fn();
    if constexpr (is_key_range<decltype(second_fn())>) produce(second);
    cp_async_wait_all();  // nothing of this thread is in flight when it exits
}

// A consumer thread's coordinates: consumer (0/1), warp in the warpgroup, fragment row g and
// column pair t. Recomputed where needed rather than held through the loop (registers are short).
struct WgCoords {
    int c, warp, g, t;
    __device__ __forceinline__ static WgCoords of() {
        return {static_cast<int>(threadIdx.x) / 128 - 1, static_cast<int>(threadIdx.x / 32) % 4,
                static_cast<int>(threadIdx.x % 32) / 4, static_cast<int>(threadIdx.x) % 4};
    }
};

// Descriptor `desc` moved `bytes` further into shared memory (the start address field is in 16 B).
__device__ __forceinline__ unsigned long long desc_add(unsigned long long desc, int bytes) { return desc + (bytes >> 4); }

// Byte offset of the 16 dims from `dim` in a tile of 64-dim swizzled column blocks of `slab` bytes.
__device__ __forceinline__ constexpr int dim_offset(int dim, int slab) { return dim / 64 * slab + dim % 64 * 2; }

// A consumer warp is done with a stage: one arrival on its empty barrier.
__device__ __forceinline__ void wg_release(mbarrier* empty) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);  // this warp is done with the stage
}

// A consumer thread's state: Q fragments of its register k-steps, O accumulator of its value dims
// (columns 0..127 and 128..255: an m64n128 accumulator each), and the online softmax of its two rows
// (g and g + 8 of its warp's 16): running max (log2 domain) and this thread's share of the running sum.
template <class C>
struct WgConsumer {
    unsigned qf[C::Q_REG_STEPS > 0 ? C::Q_REG_STEPS : 1][4];
    float o[2][C::WG_DV / 4];
    float row_max[2], row_sum[2];
    __device__ __forceinline__ float& o_at(int i) { return o[i / (C::WG_DV / 4)][i % (C::WG_DV / 4)]; }
    __device__ __forceinline__ float o_at(int i) const { return o[i / (C::WG_DV / 4)][i % (C::WG_DV / 4)]; }
};

// Load this consumer's register-resident Q fragments (k-step ks from dim reg_dim(c, ks)); both
// consumers stage the rest of Q into shared memory (column block `slab` from dim slab_dim0(slab)).
template <class C, class QRows, class RegDim, class SlabDim>
__device__ __forceinline__ void wg_begin(char* smem, WgConsumer<C>& st, const QRows& q_rows, int num_rows,
                                         const RegDim& reg_dim, const SlabDim& slab_dim0) {
    const WgCoords w = WgCoords::of();
    // Rows past num_rows repeat the last row: padding, never written back as a result.
    const int r = w.warp * 16 + w.g;
    const char* lo = q_rows.row(min(r, num_rows - 1), 0);
    const char* hi = q_rows.row(min(r + 8, num_rows - 1), 0);
#pragma unroll
    for (int ks = 0; ks < C::Q_REG_STEPS; ++ks) {
        const int d = (reg_dim(w.c, ks) + 2 * w.t) * 2;  // byte offset in a bf16 row
        st.qf[ks][0] = __ldg(reinterpret_cast<const unsigned*>(lo + d));
        st.qf[ks][1] = __ldg(reinterpret_cast<const unsigned*>(hi + d));
        st.qf[ks][2] = __ldg(reinterpret_cast<const unsigned*>(lo + d + 16));
        st.qf[ks][3] = __ldg(reinterpret_cast<const unsigned*>(hi + d + 16));
    }
    // Q's smem part by cp.async, all of a thread's chunks in flight at once (through registers it
    // took one load's latency per chunk: 7% of the DSA rows' consumer samples), through L1 (a decode
    // tile's padding rows repeat its one real row: bench/NOTES.md v21).
    constexpr int Q_CHUNKS = C::BM * C::Q_SLABS * 8;  // 16-byte chunks of Q's smem part, 8 a column block row
    static_assert(Q_CHUNKS % 256 == 0, "every consumer thread copies as many of Q's chunks");
#pragma unroll
    for (int i = threadIdx.x - 128; i < Q_CHUNKS; i += 256) {
        const int row = i % C::BM, chunk = i / C::BM, slab = chunk / 8;
        const char* src = q_rows.row(min(row, num_rows - 1), 0) + (slab_dim0(slab) + (chunk % 8) * 8) * 2;
        cp_async16_l1(smem + C::Q_SMEM_OFF + slab * C::Q_SLAB + sw128_offset(row, chunk % 8), src);
    }
    cp_async_wait_all();
    fence_async_shared();  // Q's smem part is read by wgmma (async proxy)
    named_barrier(C::EXCHANGE_BAR, 256);
#pragma unroll
    for (int i = 0; i < C::WG_DV / 2; ++i) st.o_at(i) = 0.f;
    st.row_max[0] = st.row_max[1] = neg_inf();
    st.row_sum[0] = st.row_sum[1] = 0.f;
}

// Keys past the range and keys a row does not see score -inf in a tile's scores s[4i + 2h + e]
// (row g + 8h, key 8i + 2t + e); whole prefix tiles skip the test.
template <class C, class Visible>
__device__ __forceinline__ void wg_mask(float (&s)[16], int tile, int num_keys, const Visible& visible) {
    if (Visible::ALL && (tile + 1) * C::BN <= num_keys) return;
    const WgCoords w = WgCoords::of();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = tile * C::BN + 8 * i + 2 * w.t + e, r = w.warp * 16 + w.g + 8 * h;
                if (!(key < num_keys && visible(r, key))) s[4 * i + 2 * h + e] = neg_inf();
            }
}

// Row max of row h's raw scores (the scale is positive, so it commutes with max), as a tree.
__device__ __forceinline__ float wg_row_max(const float (&s)[16], int h) {
    float m = fmaxf(fmaxf(fmaxf(s[2 * h], s[2 * h + 1]), fmaxf(s[4 + 2 * h], s[5 + 2 * h])),
                    fmaxf(fmaxf(s[8 + 2 * h], s[9 + 2 * h]), fmaxf(s[12 + 2 * h], s[13 + 2 * h])));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// Row h's scores become their probabilities 2^(s scale_log2 - ref); returns this thread's share of
// their sum.
__device__ __forceinline__ float wg_exp_row(float (&s)[16], int h, float scale_log2, float ref) {
    float p[8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            p[2 * i + e] = s[4 * i + 2 * h + e] = exp2_fast(fmaf(s[4 * i + 2 * h + e], scale_log2, -ref));
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// O *= alpha (per row h), skipped once the maxima settle (alpha is exactly 1). No P·V may be in flight.
template <class C>
__device__ __forceinline__ void wg_rescale_o(WgConsumer<C>& st, const float (&alpha)[2]) {
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
    for (int j = 0; j < C::WG_DV / 8; ++j) {
        st.o_at(4 * j) *= alpha[0]; st.o_at(4 * j + 1) *= alpha[0];
        st.o_at(4 * j + 2) *= alpha[1]; st.o_at(4 * j + 3) *= alpha[1];
    }
}

// P·V's A operand: pf[b][kk] is k-step kk (16 keys) of P for value block b (DSA rows: the
// consumer's two scale blocks, P times each; otherwise pf[0] for all its value dims).
template <class C>
using WgP = unsigned[C::KV_SCALED ? 2 : 1][C::BN / 16][4];

// Issue (and commit) O += P · V_c over ring position `pos`, P as the A operand; v: the consumer's V
// descriptor at stage 0 (N-major: 64-dim blocks SLAB apart). DSA rows: one m64n128 wgmma per value
// block (its P; its 128 dims two column blocks on), O's halves being the two blocks.
template <class C>
__device__ __forceinline__ void wg_issue_pv(WgConsumer<C>& st, unsigned long long v, int pos, const WgP<C>& pf) {
    const unsigned long long v_desc = desc_add(v, (pos % C::STAGES) * C::STAGE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk) {  // 16 keys a k-step: 2048 B of 128-byte rows
        if constexpr (C::KV_SCALED) {
            wgmma_m64n128k16_bt(st.o[0], pf[0][kk], desc_add(v_desc, kk * 16 * 128), true);
            wgmma_m64n128k16_bt(st.o[1], pf[1][kk], desc_add(v_desc, 2 * C::SLAB + kk * 16 * 128), true);
        } else {
            wgmma_m64n256k16_bt(st.o[0], st.o[1], pf[0][kk], desc_add(v_desc, kk * 16 * 128), true);
        }
    }
    wgmma_commit();
}

// DSA rows: the block scales of ring position `pos`'s keys ([BN][4] fp32); other rows have none.
template <class C>
__device__ __forceinline__ const float* ring_scales(char* smem, int pos) {
    if constexpr (C::KV_SCALED)
        return stage_scales<C>(smem, pos % C::STAGES);
    else
        return nullptr;
}

// P·V's A operand from probabilities s, row h times f[h]: k-step kk is keys 16kk .. 16kk + 15. DSA
// rows: pf[j] for value block first_block + j (consumer c's are 2c and 2c + 1), each key's
// probability times that block's scale (in fp32, rounded once).
template <class C>
__device__ __forceinline__ void wg_pack_p(const float (&s)[16], const float (&f)[2], const float* scales,
                                          int first_block, WgP<C>& pf) {
    const WgCoords w = WgCoords::of();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float p0 = s[8 * kk + 2 * k] * f[k % 2], p1 = s[8 * kk + 2 * k + 1] * f[k % 2];
            if constexpr (C::KV_SCALED) {
                const int key = 8 * (2 * kk + k / 2) + 2 * w.t;
                const float2 k0 = *reinterpret_cast<const float2*>(scales + key * 4 + first_block);
                const float2 k1 = *reinterpret_cast<const float2*>(scales + (key + 1) * 4 + first_block);
                pf[0][kk][k] = pack_bf16x2(p0 * k0.x, p1 * k1.x);
                pf[1][kk][k] = pack_bf16x2(p0 * k0.y, p1 * k1.y);
            } else {
                pf[0][kk][k] = pack_bf16x2(p0, p1);
            }
        }
}

// Consumer c's half of the partial state: part_o[BM][DV]'s value dims [c DV/2, (c+1) DV/2) of its rows
// g + 8h normalized by l = total(h, this consumer's sum of row h) (times out_scale), and (c = 0)
// part_lse[BM] (natural log; -inf for rows that saw nothing).
template <class C, class Total>
__device__ __forceinline__ void wg_store_state(const WgConsumer<C>& st, int c, const Total& total, float out_scale,
                                               float* __restrict__ part_o, float* __restrict__ part_lse) {
    const WgCoords w = WgCoords::of();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = st.row_sum[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float l = total(h, sum);
        const float inv = row_inv_l(l, out_scale);
        const int r = w.warp * 16 + w.g + 8 * h;
        if (c == 0 && w.t == 0) part_lse[r] = row_lse(st.row_max[h], l);
        float* out = part_o + r * C::DV + c * C::WG_DV + 2 * w.t;
#pragma unroll
        for (int j = 0; j < C::WG_DV / 8; ++j)
            *reinterpret_cast<float2*>(out + 8 * j) =
                make_float2(st.o_at(4 * j + 2 * h) * inv, st.o_at(4 * j + 2 * h + 1) * inv);
    }
}

}  // namespace kgen
