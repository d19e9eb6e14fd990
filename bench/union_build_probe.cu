// The union kernel's key-list build alone (bench/union_build_probe.py): each CTA builds one row
// tile's key list with kgen's own builder (templates/sparse_attention.cuh build_union: the tiles'
// lists scanned, the entries of the CTA's hash partition inserted into a shared-memory set, the set
// compacted to a list) and does nothing else, so a launch times what building a row tile's list
// costs a CTA of SET_THREADS threads: today's split (partition `part` of `parts`, every split scanning
// all of its tile's entries) or a CTA that builds its tile's whole union (parts = 1), as a key-list
// pass of its own before the attention kernel would.
#include "kgen/attention.cuh"  // the mma.sync design, which sparse_attention.cuh builds on
#include "kgen/sparse_attention.cuh"

using namespace kgen;

using Set = SlotSet<SET_TABLE, SET_TOKENS, SET_LOADS>;

// CTA c: row tile c / parts (tokens tile_tokens[tile] from token tile_first[tile] of `topk`),
// hash partition c % parts. Its list goes to out_slots / out_masks + c * list_keys; its length (or
// -1: the set overflowed) to out_count[c].
extern "C" __global__ void __launch_bounds__(SET_THREADS)
union_build_probe(const int* __restrict__ topk, int width, const int* __restrict__ tile_first,
                  const int* __restrict__ tile_tokens, int parts, long long num_slots, int list_keys,
                  int* __restrict__ out_slots, unsigned* __restrict__ out_masks, int* __restrict__ out_count) {
    extern __shared__ __align__(128) char smem[];
    const int tile = blockIdx.x / parts, part = blockIdx.x % parts, tokens = tile_tokens[tile];
    SparseArgs a{};
    a.num_slots = num_slots;
    const int size = initial_set_size<Set>(tokens * width, parts);
    const SlotFilter filter{static_cast<unsigned>(parts), static_cast<unsigned>(part), 1u, 0u};
    const long long at = (long long)blockIdx.x * list_keys;
    const int n = build_union(Set::at(smem, size), topk + (long long)tile_first[tile] * width, tokens, width, filter,
                              KeyList<unsigned>{out_slots + at, out_masks + at}, a);
    if (threadIdx.x == 0) out_count[blockIdx.x] = n;
}
