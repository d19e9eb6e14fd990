// Moving KV rows: cache[dst[n]] = cache[src[n]] in every layer, as if all reads came before any
// write. Rows are copied as 16-byte chunks. A move whose source slot is also some move's
// destination is "conflicting": phase 0 copies its source rows (all layers) to `staging`, and
// phase 1 then writes every destination, reading conflicting rows from staging and the rest
// straight from the cache, whose source slots no move writes.
#pragma once
#include "kgen/common.cuh"

namespace kgen {

constexpr int DEFRAG_LAYER_UNROLL = 8;  // loads in flight per thread before the stores

__device__ __forceinline__ void defrag_phase(const long long* __restrict__ layers,
                                             const long long* __restrict__ src,
                                             const long long* __restrict__ dst,
                                             const unsigned char* __restrict__ is_dst,
                                             uint4* __restrict__ staging, long long n, int num_layers,
                                             int row_chunks, int phase) {
    const long long total = n * row_chunks;
    const long long layer_stride = total;  // staging is [layers][n][row_chunks]
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long move = i / row_chunks;
        const int chunk = static_cast<int>(i - move * row_chunks);
        const long long s = src[move];
        const bool conflicting = is_dst[s] != 0;
        if (phase == 0 && !conflicting) continue;
        const long long from = s * row_chunks + chunk;
        const long long to = dst[move] * row_chunks + chunk;
        for (int l0 = 0; l0 < num_layers; l0 += DEFRAG_LAYER_UNROLL) {
            uint4 v[DEFRAG_LAYER_UNROLL];
#pragma unroll
            for (int u = 0; u < DEFRAG_LAYER_UNROLL; ++u) {
                const int l = l0 + u;
                if (l >= num_layers) break;
                const uint4* cache = reinterpret_cast<const uint4*>(layers[l]);
                v[u] = (phase == 1 && conflicting) ? staging[l * layer_stride + i] : cache[from];
            }
#pragma unroll
            for (int u = 0; u < DEFRAG_LAYER_UNROLL; ++u) {
                const int l = l0 + u;
                if (l >= num_layers) break;
                if (phase == 0)
                    staging[l * layer_stride + i] = v[u];
                else
                    reinterpret_cast<uint4*>(layers[l])[to] = v[u];
            }
        }
    }
}

}  // namespace kgen
