// Sparse (DSA) tree verify (DESIGN §12): tree token i of request b attends the prefix slots its
// top-k list names, topk[i][0 .. K'), -1 = no key, plus its visible tree tokens; on the mma.sync
// loop of attention.cuh (its attend(), with the per-tile visibility hook below).
//
// Work items are (request, split, row tile), as in the dense schedule. A row tile's BM packed
// (token, head) rows belong to a few tokens (BM / H, one more when H does not divide BM), and only
// the slots those tokens list can matter to it: its CTA reads those tokens' lists (ints, from L2)
// and builds its key list on the device, then streams the listed KV rows through the same ring,
// masking each (row, key) by a 32-bit membership mask (bit k: the tile's k-th token listed it).
// - union (the product): split s of S owns the slots whose hash lands in partition s. The CTA
//   inserts its tokens' entries of that partition into a shared-memory hash set (slot -> mask)
//   and compacts it to a list: each listed row is read once per row tile, whichever tokens list
//   it (and the row tiles of one split run side by side, so DRAM sees it once per request).
//   The set lives in the KV ring before the ring is used; a list that would outgrow the set's
//   capacity is split into sub-partitions by more hash bits (rounds), each appended to the list.
//   A row tile of one token has nothing to merge: its split lists its entries as they come.
// - gather (the internal baseline): split s owns a contiguous range of the tile's list entries,
//   each entry one key of one token (a slot listed by k tokens is read k times), read in place:
//   no list is built (an entry naming no slot stages a zero row, masked).
// The union's list goes to a global scratch region per CTA (LIST_KEYS keys: a row tile's entries,
// which bound its distinct slots), built whole before the CTA attends it as one key range (the ring is
// busy while the keys are read). The request's tree rides on its last split, as in verify_attn, or
// for one request whose wave has room is a split of its own (SparseArgs::tree_apart).
#pragma once
#include "kgen/attention_kernels.cuh"
#include "kgen/sparse_schedule.cuh"

namespace kgen {

// A listed key's membership mask (bit t: the row tile's token t lists it): 32 bits, or a byte where
// a tile's masks are held as loaded until its softmax (LATE_MASKS, a row tile of at most 8 tokens),
// so that a reducer's keys of a tile are one word (tile_visibility).
template <bool BYTE> struct KeyMaskPick { using type = unsigned; };
template <> struct KeyMaskPick<true> { using type = unsigned char; };
template <bool BYTE>
using KeyMask = typename KeyMaskPick<BYTE>::type;

// A CTA's key list in global scratch: n slots and their membership masks.
template <class Mask>
struct KeyList {
    int* slots;
    Mask* masks;
};

// The listed slots as KV rows of ROW_BYTES each (written by this CTA before it reads them: plain
// loads, not the read-only path).
template <int ROW_BYTES>
struct ListRows {
    const char* kv_cache;
    const int* slots;
    __device__ __forceinline__ int fetch(int j) const { return slots[j]; }
    __device__ __forceinline__ const char* row(int, int slot) const { return kv_cache + (long long)slot * ROW_BYTES; }
};

// Row r of the CTA sees key j when its token's bit is set in key j's mask (bit 0: token0). The
// masks are found as the kernel's lists argument plus a 32-bit index of its words (a step whose
// lists would reach 2^32 words is refused: kgen/sparse.py): the argument stays in the constant bank,
// where a 64-bit pointer held through the tile loop spilled on sm_120 (168 registers for 9 warps).
// Byte masks (LATE_MASKS) are held as loaded until a tile's softmax; 32-bit ones are picked at once
// (tile_visibility).
template <class C, class Mask>
struct ListVisible {
    static constexpr bool ALL = false;
    const unsigned* lists;  // SparseArgs::lists
    unsigned mask0;          // the word of lists where this CTA's masks start
    int row0, token0, num_rows;  // the tile's first row within the request, its first token, the request's rows from row0
    // The word of lists holding key j's mask, and the mask (indexed in 32 bits, as the argument).
    __device__ __forceinline__ unsigned word(int j) const { return lists[mask0 + j * (int)sizeof(Mask) / 4]; }
    __device__ __forceinline__ unsigned mask(int j) const {
        return sizeof(Mask) == 1 ? (word(j) >> (8 * (j % 4))) & 0xffu : word(j);
    }
    __device__ __forceinline__ int shift(int r) const { return (row0 + r) / C::HEADS - token0; }
    __device__ __forceinline__ bool operator()(int r, int j) const { return r < num_rows && ((mask(j) >> shift(r)) & 1u) != 0; }
};

// A visibility's answers for one tile: bit c says row red_row sees its key c of the tile.
struct ListTileVisibility {
    unsigned bits;
    __device__ __forceinline__ bool operator()(int c, int) const { return (bits >> c) & 1u; }
};

// ListVisible's answers for one tile, from its keys' masks loaded when the tile starts: held as
// loaded (bytes: a reducer's masks are whole words) until the softmax reads them, so the loads'
// latency (an L2 round trip: the masks do not stay in L1 beside the ring) hides behind the tile's
// partial scores. Picked at once, the row's bits made every tile wait for the loads before its first
// MMA (call CA: 11% of the batched union's warp samples, bench/NOTES.md v106); that stays for row
// tiles of more than 8 tokens, whose masks are words.
template <class C>
struct ListTileBytes {
    unsigned words[C::RED_COLS / 4];  // key c's mask is byte c; 0 for a padding row
    const ListVisible<C, unsigned char>& v;
    int row;
    __device__ __forceinline__ bool operator()(int c, int) const {
        return ((words[c / 4] >> (8 * (c % 4) + v.shift(row))) & 1u) != 0;
    }
};
template <class C>
__device__ __forceinline__ ListTileBytes<C> tile_visibility(const ListVisible<C, unsigned char>& v, int tile,
                                                            int num_keys, const WarpCoords& w) {
    static_assert(C::RED_COLS % 4 == 0, "a reducer's keys' byte masks are whole words");
    ListTileBytes<C> m{{}, v, w.red_row};
    const int key0 = tile * C::BN + w.red_col0;  // a multiple of 4
#pragma unroll
    for (int i = 0; i < C::RED_COLS / 4; ++i)  // bytes past the list: ignored (softmax_row tests key < num_keys)
        m.words[i] = w.red_row < v.num_rows && key0 + 4 * i < num_keys ? v.word(key0 + 4 * i) : 0u;
    return m;
}
// 32-bit masks: the row's bits picked at once. (Written so, the sm_120 plan's union over scaled rows
// keeps 0 spills: as little as its key index computed before the padding-row test spilled 92 B.)
template <class C>
__device__ __forceinline__ ListTileVisibility tile_visibility(const ListVisible<C, unsigned>& v, int tile, int num_keys,
                                                              const WarpCoords& w) {
    static_assert(C::RED_COLS <= 32, "a row's keys of a tile fit one word");
    if (w.red_row >= v.num_rows) return {0u};  // a padding row sees nothing
    const int shift = v.shift(w.red_row);
    unsigned bits = 0;
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c) {
        const int key = tile * C::BN + w.red_col0 + c;
        if (key < num_keys) bits |= ((v.word(key) >> shift) & 1u) << c;
    }
    return {bits};
}

__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// Partition hash: Fibonacci hashing (one multiply by 2^32 / golden ratio, a bijection). Its high
// bits pick a slot's partition, its low bits (the slot's low bits, permuted) a round's
// sub-partition. The scan hashes every entry of its tile's lists, so this is what an entry costs.
__device__ __forceinline__ unsigned slot_hash(unsigned slot) { return slot * 0x9e3779b1u; }

// Probe hash (murmur3's finalizer, a bijective mix), computed for inserted entries only: probing
// from the Fibonacci hash again clusters, since 0x9e3779b1^2 = -2^32 x 0.0004 (mod 2^32) maps a
// page's consecutive slots to neighbouring entries (measured: B=64 L=8192 699 -> 936 us).
__device__ __forceinline__ unsigned mix32(unsigned x) {
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

// Which slots a union round takes: partition `split` of `splits` (the hash's high bits), and of
// those the sub-partition `rem` of `mod` (its low bits; mod = 1 takes all).
struct SlotFilter {
    unsigned splits, split, mod, rem;
    __device__ __forceinline__ bool operator()(unsigned h) const {
        return __umulhi(h, splits) == split && (h & (mod - 1)) == rem;
    }
};

// Shared memory of a hash set of `table` entries (SlotSet::BYTES): keys, masks, counters, scan scratch.
constexpr int slot_set_bytes(int table) { return table * 8 + 34 * 4; }

// The shared-memory hash set of a union round: `size` slots (-1 = empty) and masks, then the
// count of slots inserted and the overflow flag, then 32 ints of scan scratch (BYTES, in the KV
// ring), then each warp's queue of entries to insert (build_union: on into the partial-score region,
// all of it idle while the list is built; LOADS, the entries a thread scans at a time, is what the room
// before the barriers allows, up to 32). The layout is TABLE's; a round uses `size` <= TABLE
// entries (a power of two), picked for the split's expected share of keys, so clearing and
// compacting it costs what the split needs. A row tile of at most 4 tokens (TOKENS) keeps a slot's
// membership as one byte a token in its mask word: a lane sets its token's byte with a plain store,
// which no other token's store can clobber, so an entry costs no atomic but the CAS that places a new
// slot (the atomicOr a listing took was most of a batched CTA's shared atomics: bench/NOTES.md v85);
// compact() packs the bytes into bits.
template <int TABLE, int TOKENS_, int LOADS_>
struct SlotSet {
    static constexpr int TOKENS = TOKENS_;
    static constexpr bool BYTE_FLAGS = TOKENS <= 4;
    static constexpr int TABLE_ENTRIES = TABLE;
    static constexpr int CAP = TABLE / 2;      // keys a round holds at most
    static constexpr int MIN_SIZE = 1024;      // > 2 x the threads: even a full round leaves probes an empty entry
    static constexpr int LOADS = LOADS_;       // list entries a thread scans at a time
    static constexpr int QUEUE_PER_WARP = 32 * LOADS;  // entries (u32) of a warp's insertion queue
    static constexpr int BYTES = slot_set_bytes(TABLE);  // without the queues, which follow
    // A queued entry is its slot with its token in the top TOKEN_BITS bits: the slots a step reads are
    // below 2^SLOT_BITS (kgen/sparse.py refuses a larger cache).
    static constexpr int TOKEN_BITS = TOKENS <= 1 ? 0 : TOKENS <= 2 ? 1 : TOKENS <= 4 ? 2 : TOKENS <= 8 ? 3 : TOKENS <= 16 ? 4 : 5;
    static constexpr int SLOT_BITS = 32 - TOKEN_BITS;
    static_assert((TABLE & (TABLE - 1)) == 0 && TABLE >= MIN_SIZE, "TABLE is a power of two >= MIN_SIZE");
    static_assert(LOADS >= 16 && LOADS <= 32, "a thread's passing entries are bits of a word; enough loads in flight");
    int* keys;
    unsigned* masks;
    int* count;  // [0] inserted, [1] overflow
    int* scan;
    unsigned* queue;
    int size, bits;

    __device__ __forceinline__ static SlotSet at(char* smem, int size) {
        int* keys = reinterpret_cast<int*>(smem);
        unsigned* masks = reinterpret_cast<unsigned*>(keys + TABLE);
        int* count = reinterpret_cast<int*>(masks + TABLE);
        return {keys, masks, count, count + 2, reinterpret_cast<unsigned*>(smem + BYTES), size, __ffs(size) - 1};
    }

    __device__ __forceinline__ static int queue_entry(int slot, int token) {
        return static_cast<int>(static_cast<unsigned>(slot) | (TOKEN_BITS == 0 ? 0u : static_cast<unsigned>(token) << SLOT_BITS));
    }
    __device__ __forceinline__ static int entry_slot(unsigned entry) {
        return static_cast<int>(SLOT_BITS == 32 ? entry : entry & ((1u << (SLOT_BITS & 31)) - 1));
    }
    __device__ __forceinline__ static int entry_token(unsigned entry) {
        return TOKEN_BITS == 0 ? 0 : static_cast<int>(entry >> (SLOT_BITS & 31));
    }

    // Each warp clears (and compact() reads) its run of whole 32-entry chunks, a lane the same entries
    // in both: a round's clear() then never overwrites an entry another thread of the previous round's
    // compact() has yet to read, with no barrier between them.
    __device__ __forceinline__ void chunks_of_warp(int& c0, int& c1) const {
        const int chunks = size / 32, per = (chunks + blockDim.x / 32 - 1) / (blockDim.x / 32);
        c0 = min(chunks, static_cast<int>(threadIdx.x / 32) * per);
        c1 = min(chunks, c0 + per);
    }

    __device__ __forceinline__ void clear() const {
        int c0, c1;
        chunks_of_warp(c0, c1);
        for (int i = c0 * 32 + threadIdx.x % 32; i < c1 * 32; i += 32) {
            keys[i] = -1;
            masks[i] = 0u;
        }
        if (threadIdx.x < 2) count[threadIdx.x] = 0;
    }

    // A slot's first probe position (from h, mix32 of the slot).
    __device__ __forceinline__ unsigned home(unsigned h) const { return (h * 0x9e3779b1u) >> (32 - bits); }

    // Whether the round has overflowed (it is redone with a larger set, or in halves): its inserts
    // may stop.
    __device__ __forceinline__ bool overflowed() const { return *(volatile int*)&count[1] != 0; }

    // One probe of inserting `slot` at position p: 0 = the entry holds another slot (probe p + 1 next),
    // 1 = `token` added to the slot's mask, 2 = the same and the slot is new here. The slots are
    // counted per warp and step (count_new), not here: one shared counter every new slot added to
    // serialized the inserts (bench/NOTES.md v55).
    __device__ __forceinline__ int probe(int slot, unsigned p, int token) const {
        volatile int* vkeys = keys;
        int k = vkeys[p];
        bool added = false;
        if (k == -1) {
            k = atomicCAS(&keys[p], -1, slot);
            added = k == -1;
            if (added) k = slot;
        }
        if (k != slot) return 0;
        if constexpr (BYTE_FLAGS) reinterpret_cast<unsigned char*>(masks)[p * 4 + token] = 1;
        else atomicOr(&masks[p], 1u << token);
        return added ? 2 : 1;
    }

    // A warp's new slots of a step (every lane passes its count); over size / 2 in all, the set
    // overflows.
    __device__ __forceinline__ void count_new(int added) const {
        added = __reduce_add_sync(0xffffffffu, added);
        if (threadIdx.x % 32 == 0 && added > 0 && atomicAdd(&count[0], added) + added > size / 2) count[1] = 1;
    }

    // Write the set's slots and masks to `list` (in table order); returns how many. By the warps'
    // chunks, so consecutive lanes write consecutive list entries (one thread a strided run of
    // entries wrote 32 scattered words a store).
    template <class Mask>
    __device__ __forceinline__ int compact(const KeyList<Mask>& list) const {
        const int lane = threadIdx.x % 32;
        int c0, c1;
        chunks_of_warp(c0, c1);
        int n = 0;
        for (int c = c0; c < c1; ++c) n += __popc(__ballot_sync(0xffffffffu, keys[c * 32 + lane] != -1));
        int total;
        int at = block_inclusive_sum(lane == 0 ? n : 0, scan, &total) - n;
        at = __shfl_sync(0xffffffffu, at, 0);
        for (int c = c0; c < c1; ++c) {
            const int k = keys[c * 32 + lane];
            const unsigned held = __ballot_sync(0xffffffffu, k != -1);
            if (k != -1) {
                const int j = at + __popc(held & ((1u << lane) - 1));
                const unsigned m = masks[c * 32 + lane];
                list.slots[j] = k;
                list.masks[j] = static_cast<Mask>(BYTE_FLAGS ? (m * 0x01020408u) >> 24 : m);  // byte t (0 or 1) to bit t
            }
            at += __popc(held);
        }
        return total;
    }
};

// The token of list entry e of a row tile's lists (token t's entries are [t * width, (t + 1) * width)):
// by TOKENS - 1 compares where a tile has few tokens, as GLM-5's 4 a tile: a division by the runtime
// width was ~25 instructions an entry (bench/NOTES.md v92).
template <int TOKENS>
__device__ __forceinline__ int token_of(int e, int width) {
    if constexpr (TOKENS <= 8) {
        int t = 0;
#pragma unroll
        for (int k = 1; k < TOKENS; ++k) t += e >= k * width;
        return t;
    } else {
        return e / width;
    }
}

// The set size a split starts with: room for twice its expected entries (E / S of them hash to
// it), which no distinct count reaches short of a skewed hash.
template <class Set>
__device__ __forceinline__ int initial_set_size(int entries, int splits) {
    const int want = 4 * ((entries + splits - 1) / splits);
    int size = Set::MIN_SIZE;
    while (size < want && size < Set::TABLE_ENTRIES) size *= 2;
    return size;
}

// Which list entries name rows: slots in [0, num_slots); -1 (any negative) is no key. Slots are
// int32, so one unsigned compare against min(num_slots, 2^31) tells both apart, branch-free. A slot
// outside the cache is skipped all the same; with `validate`, report() reads the entries again and
// raises bit 2 of the error flag if one is: a pass of its own, so that the scans' test of an entry
// stays that one compare (tracking it there cost the union's unrolled scan 4 instructions an entry).
struct SlotRange {
    unsigned limit;
    __device__ __forceinline__ explicit SlotRange(long long num_slots)
        : limit(static_cast<unsigned>(min(num_slots, 1LL << 31))) {}
    __device__ __forceinline__ bool names(int slot) const { return static_cast<unsigned>(slot) < limit; }
    // Entries [e0, e1) of `lists`, the CTA's threads together.
    __device__ __forceinline__ void report(const int* lists, int e0, int e1, const SparseArgs& a) const {
        if (!a.validate) return;
        bool outside = false;
        for (int e = e0 + threadIdx.x; e < e1; e += blockDim.x) outside |= lists[e] >= 0 && !names(lists[e]);
        if (outside) atomicOr(a.error_flag, 2);
    }
};

// Union round: the tile's tokens' entries (tokens x width ints at `lists`) whose slot passes
// `filter`, into the set, then compacted into `list`. Returns the list's length, or -1 if the set
// overflowed (nothing of it may be used). The scan stays converged: each warp queues its passing
// entries of a step of LOADS loads (into its own queue: the entry's slot and token, so LOADS x 32
// entries fit, and inserting one reads no global memory: bench/NOTES.md v100) and then inserts them,
// a lane taking the next queued entry whenever its own is placed (bench/NOTES.md v83). Inserting
// inside the scan let the lanes of a warp drift apart in their probe loops, and the warp then ran
// the scan ~4x over with ~7 lanes each (ncu, bench/NOTES.md v19). Not inlined, as
// write_sparse_item: it runs once per round, and inlined its temporaries spilled the sm_120 kernel
// at its register cap.
template <class Set, class Mask>
__device__ __noinline__ int build_union(const Set set, const int* lists, int tokens, int width, const SlotFilter filter,
                                        const KeyList<Mask> list, const SparseArgs a) {
    constexpr int LOADS = Set::LOADS;  // entries a thread has in flight: the scan is a few L2 latencies
    set.clear();
    __syncthreads();
    const int lane = threadIdx.x % 32;
    SlotRange range(a.num_slots);
    const unsigned queue = smem_addr(set.queue + (threadIdx.x / 32) * Set::QUEUE_PER_WARP);
    const int entries = tokens * width, step = LOADS * blockDim.x;
    // The next step's entries are loaded before this step's inserts, so their L2 latency overlaps them.
    auto load = [&](int (&slot)[LOADS], int e0) {
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            const int e = e0 + u * blockDim.x;
            slot[u] = e < entries ? __ldg(lists + e) : -1;
        }
    };
    int next[LOADS];
    load(next, threadIdx.x);
    for (int e0 = threadIdx.x; e0 - lane < entries; e0 += step) {  // whole warps iterate
        int slot[LOADS];
#pragma unroll
        for (int u = 0; u < LOADS; ++u) slot[u] = next[u];
        load(next, e0 + step);
        // Bit u: this lane's entry u passes (an entry past the lists was loaded as -1, which names no
        // slot). Then the lane's passing entries go to the warp's queue after those of the lanes before
        // it: one warp-wide sum a step, not a ballot and a count an entry (bench/NOTES.md v94, v94b).
        // Each entry becomes its queue entry (its slot and token) once tested.
        unsigned passed = 0;
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            passed |= static_cast<unsigned>(range.names(slot[u]) && filter(slot_hash(static_cast<unsigned>(slot[u])))) << u;
            slot[u] = Set::queue_entry(slot[u], token_of<Set::TOKENS>(e0 + u * blockDim.x, width));
        }
        const int mine = __popc(passed);
        int at = warp_inclusive_sum(mine);
        const int queued = __shfl_sync(0xffffffffu, at, 31);
        at -= mine;
        // Every entry's store, predicated (a loop over the set bits would index slot[] at run time,
        // which puts the array in local memory).
#pragma unroll
        for (int u = 0; u < LOADS; ++u)
            if ((passed >> u) & 1u) sts_u32(queue + 4 * at++, slot[u]);
        __syncwarp();
        // The queued entries, one a lane; while entries are left to hand out, a lane whose entry is
        // placed takes the next one, so the warp steps through its entries' probes, not through each
        // round's longest probe chain; then each lane finishes its own (no votes: a warp that queued
        // 32 entries or fewer, as at B = 1, runs only this).
        int added = 0, key = 0, probes = 0, taken = 32;  // taken: queue entries handed out (warp-uniform)
        unsigned p = 0;
        int token = 0;
        // Queue entry i to this lane; false (dropped) once the round has overflowed.
        auto take = [&](int i) {
            const unsigned entry = lds_u32(queue + 4 * i);
            key = Set::entry_slot(entry);
            token = Set::entry_token(entry);
            p = set.home(mix32(static_cast<unsigned>(key)));
            probes = 0;
            return !set.overflowed();
        };
        // One probe of this lane's entry; false once it is placed, or the set is full.
        auto step_entry = [&] {
            const int placed = set.probe(key, p, token);
            added += placed == 2;
            if (placed != 0) return false;
            p = (p + 1) & (set.size - 1);
            if (++probes < set.size) return true;
            set.count[1] = 1;  // no empty entry: the set is full
            return false;
        };
        bool busy = lane < queued && take(lane);
        while (taken < queued) {
            if (busy) busy = step_entry();
            const unsigned idle = __ballot_sync(0xffffffffu, !busy);
            const int mine = taken + __popc(idle & ((1u << lane) - 1));
            if (!busy && mine < queued) busy = take(mine);
            taken += __popc(idle);
        }
        while (busy) busy = step_entry();
        set.count_new(added);
        __syncwarp();  // the queue is read before the next step writes it
    }
    __syncthreads();
    const bool fits = set.count[1] == 0;
    __syncthreads();  // every thread has read the flag before the next round clears it
    return fits ? set.compact(list) : -1;
}

// The union's list of a one-token row tile: its entries [e0, e1) that name a row, in order.
template <class Mask>
__device__ __noinline__ int build_entry_list(int* scan, const KeyList<Mask> list, const int* lists, int width, int e0,
                                             int e1, const SparseArgs a) {
    const int per = (e1 - e0 + blockDim.x - 1) / blockDim.x;
    const int begin = e0 + threadIdx.x * per, end = min(e1, begin + per);
    SlotRange range(a.num_slots);
    int n = 0;
    for (int e = begin; e < end; ++e) n += range.names(lists[e]);
    range.report(lists, e0, e1, a);
    int total;
    int at = block_inclusive_sum(n, scan, &total) - n;
    for (int e = begin; e < end; ++e) {
        const int slot = lists[e];
        if (range.names(slot)) {
            list.slots[at] = slot;
            list.masks[at] = static_cast<Mask>(1u << (e / width));
            ++at;
        }
    }
    return total;
}

// The rows of a sparse work item (its request's tree tokens from its row tile on).
template <class C>
__device__ __forceinline__ ItemRows sparse_item_rows(const SparseArgs& a, const SparseItem& item) {
    const int qo0 = a.qo_indptr[item.b], tokens = min(a.qo_indptr[item.b + 1] - qo0, a.max_nodes);
    return {qo0, tokens, (long long)qo0 * C::HEADS + item.row_tile * C::BM, tokens * C::HEADS - item.row_tile * C::BM};
}

// Q's tile apart from the ring (C::Q_APART): its copies start before the key list is built (the
// set holds the ring), so they land meanwhile (bench/NOTES.md v49). Not inlined: inlined, its
// registers spilled a word across the key loop.
template <class C>
__device__ __noinline__ void copy_item_q(char* smem, const bf16* q, const SparseArgs a, const SparseItem item) {
    const ItemRows r = sparse_item_rows<C>(a, item);
    copy_q<C>(smem, item_q_rows<C>(q, r), r.rows);
}

// The row a gather key whose list entry names no slot (-1, or outside the cache) is staged from:
// zeros in every row format (latent, block scales, rope), so its P·V term is 0 whatever the cache
// holds (its score the softmax masks). Never written.
template <int ROW_BYTES>
__device__ __align__(16) char zero_row[ROW_BYTES];

// A gather split's keys read in place: key j is entry entry0 + j of topk (no key list is built:
// each entry is one key of its own token). Every field but entry0 is a kernel argument, which
// ptxas reloads from the constant bank rather than hold in registers through the loop.
template <int ROW_BYTES>
struct EntryRows {
    const char* kv_cache;
    const int* topk;  // SparseArgs::topk
    long long num_slots;
    unsigned entry0;  // the split's first entry in topk
    __device__ __forceinline__ int fetch(int j) const { return __ldg(topk + entry0 + j); }
    __device__ __forceinline__ const char* row(int, int slot) const {
        return SlotRange(num_slots).names(slot) ? kv_cache + (long long)slot * ROW_BYTES : zero_row<ROW_BYTES>;
    }
};

// Row r sees gather key j when its entry names a row and is the row's token's: key j is entry
// e0 + j of the row tile's, token t's entries are [t x width, (t + 1) x width).
template <class C>
struct EntryVisible {
    const int* topk;  // kernel arguments: SparseArgs::topk, num_slots, topk_width
    long long num_slots;
    int width;
    unsigned entry0;  // the split's first entry in topk
    int e0;  // and among its row tile's entries
    int head0, num_rows;  // the tile's first row's head; the request's rows from the tile's first
};

// EntryVisible's answers for one tile: the keys of the row's token, as a window of bits, and of
// those the entries that name a row, loaded when the tile starts (as ListVisible's masks).
template <class C>
__device__ __forceinline__ ListTileVisibility tile_visibility(const EntryVisible<C>& v, int tile, int num_keys,
                                                              const WarpCoords& w) {
    static_assert(C::RED_COLS <= 32, "a row's keys of a tile fit one word");
    if (w.red_row >= v.num_rows) return {0u};  // a padding row sees nothing
    const int key0 = tile * C::BN + w.red_col0;
    const int token = (v.head0 + w.red_row) / C::HEADS;
    // The token's keys are the columns [first, end), cut at the split's last key.
    const int first = token * v.width - v.e0 - key0, end = min(first + v.width, num_keys - key0);
    const SlotRange range(v.num_slots);
    unsigned bits = 0;
#pragma unroll
    for (int c = 0; c < C::RED_COLS; ++c)
        if (c < end) bits |= static_cast<unsigned>(range.names(__ldg(v.topk + v.entry0 + key0 + c))) << c;
    const int lo = min(max(first, 0), C::RED_COLS), hi = min(max(end, lo), C::RED_COLS);
    return {bits & static_cast<unsigned>((1ull << hi) - (1ull << lo))};
}

// A split's entries of its row tile's lists: [e0, e1) of the tile's tokens x width entries (none for
// the tree's own split, split == splits).
__device__ __forceinline__ void split_entries(const SparseItem& item, int entries, int& e0, int& e1) {
    const int per = (entries + item.splits - 1) / item.splits;
    e0 = min(entries, item.split * per);  // per <= the schedule's max_chunk, or one token's entries
    e1 = min(entries, e0 + per);
}

// The item's attention over the key range keys_of(its rows) and, in its request's last split, the
// request's tree tokens under the tree mask, into the partial state of slot blockIdx.x.
template <class C, int MASK_WORDS, class RequestMask, class KeysOf, class PartO>
__device__ __forceinline__ void attend_item(char* smem, const bf16* q, float kv_scale, const char* k_tree,
                                            const RequestMask& request_mask, const SparseArgs& a,
                                            const SparseItem& item, const KeysOf& keys_of, PartO* part_o,
                                            float* part_lse, float scale_log2) {
    const ItemRows r = sparse_item_rows<C>(a, item);
    const auto keys = keys_of(r);
    const bool last_split = item.split == item.splits - 1 + a.tree_apart;  // it attends the request's tree
    const auto tree = [&] { return tree_range<C, MASK_WORDS>(k_tree, request_mask, r, item.row_tile, last_split); };
    const auto attend_from = [&](const auto& q_rows) {  // StagedQ where copy_item_q started Q's copies
        attend<C>(smem, q_rows, r.rows, scale_log2, kv_scale, keys, tree, part_o + (long long)blockIdx.x * C::BM * C::DV,
                  part_lse + (long long)blockIdx.x * C::BM);
    };
    if constexpr (C::Q_APART) attend_from(StagedQ{});
    else attend_from(item_q_rows<C>(q, r));
}

// Entries a union thread scans at a time (SlotSet::LOADS): 32, or what the room for the warps'
// queues (4 B an entry) between a set of TABLE entries and the barriers allows (kgen/sparse_plan.py
// leaves room for 16).
template <int TABLE, class C>
constexpr int queue_loads() {
    constexpr int room = (C::BAR_OFF - slot_set_bytes(TABLE)) / (C::THREADS * 4);
    return room < 32 ? room : 32;
}

// sparse_verify_attn (UNION) and sparse_gather_attn: the item's split of its row tile's listed
// slots, then, in the last split, the request's tree tokens under the tree mask; one online
// softmax into the partial state of slot blockIdx.x. LIST_KEYS: keys of a CTA's list scratch;
// LATE_MASKS: the union's byte masks held as loaded until a tile's softmax (ListVisible).
template <class C, bool UNION, int TABLE, int LIST_KEYS, bool LATE_MASKS, int MASK_WORDS, class RequestMask, class PartO>
__device__ __forceinline__ void sparse_attention(char* smem, const bf16* q, const char* kv_cache, float kv_scale,
                                                 const char* k_tree, const RequestMask& request_mask,
                                                 const SparseArgs& a, const int* schedule_table, PartO* part_o,
                                                 float* part_lse, float scale_log2) {
    static_assert(C::BM <= 32, "a row tile's tokens fit one 32-bit membership mask");
    using Set = SlotSet<TABLE, TILE_TOKENS<C::HEADS, C::BM>, queue_loads<TABLE, C>()>;
    static_assert(Set::BYTES <= C::RING_BYTES, "the hash set fits the KV ring");
    // Launched to overlap the kernel before (Variant.waits_for_prior): everything it reads or writes,
    // the schedule table included (a step's first call writes it in the launch before), may be that
    // kernel's, so the CTA waits for it before anything else.
    wait_for_prior_grid();
    const SparseItem item = find_sparse_item<C::HEADS, C::BM>(a, schedule_table, schedule_scratch<C>(smem));
    if (item.b < 0) return;
    if constexpr (C::Q_APART) copy_item_q<C>(smem, q, a, item);
    const int row0 = item.row_tile * C::BM, token0 = row0 / C::HEADS, width = a.topk_width;
    const auto tile_tokens = [&](const ItemRows& r) { return (row0 + min(r.rows, C::BM) - 1) / C::HEADS + 1 - token0; };
    if constexpr (!UNION) {
        // The split's entries are its keys, read in place.
        attend_item<C, MASK_WORDS>(smem, q, kv_scale, k_tree, request_mask, a, item, [&](const ItemRows& r) {
            int e0, e1;
            split_entries(item, tile_tokens(r) * width, e0, e1);
            const unsigned entry0 = static_cast<unsigned>(r.qo0 + token0) * width + e0;  // < 2^32: kgen/sparse.py
            SlotRange(a.num_slots).report(a.topk + entry0 - e0, e0, e1, a);
            const EntryRows<C::KV_ROW> rows{kv_cache, a.topk, a.num_slots, entry0};
            const EntryVisible<C> visible{a.topk, a.num_slots, width, entry0, e0, row0 % C::HEADS, r.rows};
            return KeyRange<EntryRows<C::KV_ROW>, EntryVisible<C>>{rows, e1 - e0, visible, 0, (e1 - e0 + C::BN - 1) / C::BN};
        }, part_o, part_lse, scale_log2);
    } else {
        using Mask = KeyMask<LATE_MASKS>;
        static_assert(!LATE_MASKS || Set::TOKENS <= 8, "byte masks: a row tile of at most 8 tokens");
        const KeyList<Mask> list{a.lists + (long long)blockIdx.x * 2 * LIST_KEYS,
                                 reinterpret_cast<Mask*>(reinterpret_cast<unsigned*>(a.lists) + ((long long)blockIdx.x * 2 + 1) * LIST_KEYS)};
        // The item's key list, built whole (its rows are read again after: held, they spilled across the
        // builders' calls).
        const int n = [&] {
            int count = 0;
            const ItemRows r = sparse_item_rows<C>(a, item);
            const int tokens = tile_tokens(r);
            const int* lists = a.topk + (long long)(r.qo0 + token0) * width;
            // A row tile of one token (decode, or a request's last tile) has no lists to merge: its
            // token's slots are distinct (DESIGN §12), so its split lists its entries as they come.
            if (tokens == 1) {
                int e0, e1;
                split_entries(item, width, e0, e1);
                return build_entry_list(Set::at(smem, Set::MIN_SIZE).scan, list, lists, width, e0, e1, a);
            }
            // An overflowing round is redone with a larger set, up to TABLE; then the rounds walk the
            // sub-partitions depth first: (mod, rem) splits into (2 mod, rem) and (2 mod, rem + mod).
            // Rounds take disjoint slots, so their lists append.
            int size = initial_set_size<Set>(tokens * width, item.splits);
            unsigned mod = 1, rem = 0;
            while (true) {
                const SlotFilter filter{static_cast<unsigned>(item.splits), static_cast<unsigned>(item.split), mod, rem};
                const int m = build_union(Set::at(smem, size), lists, tokens, width, filter,
                                          KeyList<Mask>{list.slots + count, list.masks + count}, a);
                if (m < 0) {
                    if (size < TABLE) size *= 2;
                    else mod *= 2;
                    continue;
                }
                count += m;
                while (mod > 1 && rem >= mod / 2) {  // up while this was a second half
                    rem -= mod / 2;
                    mod /= 2;
                }
                if (mod == 1) break;
                rem += mod / 2;  // the other half
            }
            // Every split scanned all the tile's entries and skipped the slots outside the cache; one
            // reports them (KGEN_VALIDATE), once, not every split every round.
            if (item.split == 0) SlotRange(a.num_slots).report(lists, 0, tokens * width, a);
            return count;
        }();
        // The ring held the hash set (generic-proxy writes) that the loop's copies now overwrite; the
        // masks, read in every tile's softmax, are fetched into L1 first (this CTA just wrote them).
        fence_proxy_async();
        __syncthreads();
        constexpr int LINE = 128 / sizeof(Mask);  // masks a cache line
        for (int i = threadIdx.x * LINE; i < n; i += blockDim.x * LINE) prefetch_l1(list.masks + i);
        attend_item<C, MASK_WORDS>(smem, q, kv_scale, k_tree, request_mask, a, item, [&](const ItemRows& r) {
            const ListRows<C::KV_ROW> rows{kv_cache, list.slots};
            const ListVisible<C, Mask> visible{reinterpret_cast<const unsigned*>(a.lists),
                                               static_cast<unsigned>((blockIdx.x * 2 + 1) * LIST_KEYS), row0, token0, r.rows};
            return KeyRange<ListRows<C::KV_ROW>, ListVisible<C, Mask>>{rows, n, visible, 0, (n + C::BN - 1) / C::BN};
        }, part_o, part_lse, scale_log2);
    }
    // The sparse combine may launch once every CTA is here or gone (CTAs without an item): after the
    // loop, since a combine started early measured slower (bench/NOTES.md v29).
    launch_dependents();
}

}  // namespace kgen
