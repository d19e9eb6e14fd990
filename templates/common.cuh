// kgen device helpers shared by every kernel. NVRTC-safe: no host headers, no std::.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kgen {

using bf16 = __nv_bfloat16;

constexpr float LN2 = 0.6931471805599453f;
constexpr float E4M3_MAX = 448.f;  // the largest finite e4m3 value

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Programmatic dependent launch (sm_90+; every arch kgen plans for has it). A kernel launched
// right after this one with programmatic stream serialization (kgen's combine: Variant.waits_for_prior)
// may start once every CTA of this one has called launch_dependents or exited: its launch and its
// CTAs' start then overlap this kernel's tail rather than follow it.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// Waits until the kernels this one may overlap (the previous one on the stream, launched as above)
// have ended and their writes are visible; nothing to wait for in a kernel launched the usual way.
__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// 2^x with the SFU (inputs are already scaled by log2(e)); 2^-inf = 0.
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- block-wide reductions (blockDim.x a multiple of 32, at most 1024) ----

struct Sum {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ __forceinline__ int operator()(int a, int b) const { return max(a, b); }
};

// Every thread gets the reduction of `v` over the block; `scratch` holds 32 values.
template <class Op, typename T>
__device__ __forceinline__ T block_reduce(T v, T* scratch) {
    const Op op;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
    __syncthreads();  // scratch may be reused right after
    return v;
}

// ---- mbarriers, bulk copies and named barriers (sm_90+) ----

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Inclusive sum of v over lanes 0 .. this lane of the (converged) warp.
__device__ __forceinline__ int warp_inclusive_sum(int v) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const int before = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += before;
    }
    return v;
}

using mbarrier = unsigned long long;

// A barrier whose phase completes after `count` arrivals (and, with expect_tx, the bytes announced).
__device__ __forceinline__ void mbar_init(mbarrier* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Make initialized barriers visible to the bulk-copy (async) proxy; follow with a block barrier.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (the sparse hash set, Q's padding rows) before bulk copies
// overwrite them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(mbarrier* bar) {
    asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n"
                 :: "r"(smem_addr(bar)) : "memory");
}

// Arrive, and announce `bytes` that bulk copies will complete on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(mbarrier* bar, unsigned bytes) {
    asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// Block until the phase of parity `parity` has completed (acquire: its copies are visible).
__device__ __forceinline__ void mbar_wait(mbarrier* bar, unsigned parity) {
    asm volatile("{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra WAIT_%=;\n}\n"
                 :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}

// Copy `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory
// with the bulk-copy engine; the bytes complete on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, mbarrier* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// ---- thread block clusters (sm_90+): a CTA's peers, their barriers, copies into all of them ----

// This CTA's rank in its (1-D) cluster.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every CTA of the cluster: this CTA's shared memory writes and barrier set-up
// are visible to the peers, and none of them goes on (or exits) before all have arrived.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Arrive on the barrier at `bar`'s offset in cluster CTA `rank`'s shared memory (a consumer
// freeing a stage the peer's producer refills: the refill is a bulk copy, which the arrival's
// default release orders after this warp's reads, as CUTLASS's cluster pipelines rely on; a
// release at cluster scope is a fence per arrival, and cost the loop 2x: bench/NOTES.md v35).
__device__ __forceinline__ void mbar_arrive_cluster(mbarrier* bar, unsigned rank) {
    asm volatile("{\n .reg .b32 peer;\n mapa.shared::cluster.u32 peer, %0, %1;\n"
                 " mbarrier.arrive.shared::cluster.b64 _, [peer];\n}\n"
                 :: "r"(smem_addr(bar)), "r"(rank) : "memory");
}

// bulk_copy into the shared memory of every cluster CTA in `cta_mask`, at dst's offset in each;
// the bytes complete on the barrier at bar's offset in each.
__device__ __forceinline__ void bulk_copy_multicast(void* dst, const void* src, unsigned bytes, mbarrier* bar,
                                                    unsigned short cta_mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1], %2, [%3], %4;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "h"(cta_mask) : "memory");
}

// ---- tensor copies (TMA, sm_90+): whole KV tiles of consecutive slots ----

// A CUtensorMap (cuda.h's, 128 bytes, 64-aligned), made on the host (kgen/tilemap.py) and passed by
// value as a __grid_constant__ kernel parameter, so its address is one the copy engine may read.
struct alignas(64) TileMap {
    unsigned long long words[16];
};

// The box of the 2-D tensor `map` describes (a KV cache: 8-byte elements x slots) at element x of
// rows y, y + 1, ... to dst (128-byte aligned; 1024 with the map's 128-byte swizzle), as the map
// lays it out: staged rows, box columns past a row's end landing as zeros (its padding), or one
// swizzled column block. The bytes complete on `bar`, and, with a cta_mask, the same copy lands at
// dst's offset in every cluster CTA it names.
__device__ __forceinline__ void tile_copy(void* dst, const TileMap* map, int x, int y, mbarrier* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void tile_copy_multicast(void* dst, const TileMap* map, int x, int y, mbarrier* bar,
                                                    unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_addr(bar)), "h"(cta_mask) : "memory");
}

// A float from shared memory, loaded where it is used (volatile: the compiler may not keep an
// earlier load of it in a register instead, where registers are the scarcer resource).
__device__ __forceinline__ float lds_f32(const void* p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_addr(p)));
    return v;
}

// A u32 to / from shared address `addr` (smem_addr): where a function that is not inlined gets a
// pointer into shared memory, the compiler no longer knows its space and goes through generic
// 64-bit addresses (five more instructions a store in the union's unrolled scan: bench/NOTES.md v91).
__device__ __forceinline__ void sts_u32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned lds_u32(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive at barrier `id` without waiting (its other side waits with named_barrier).
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- tensor-core fragments (mma.sync, fp32 accumulate) ----

// Four 8x8 b16 matrices; lane i supplies the row address of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
}

// Two 8x8 b16 matrices; lanes 0-15 supply the row addresses (lane i of matrix i / 8).
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
}

// d += a * b for one 16x8 tile with k = 16.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 in.
__device__ __forceinline__ void mma_16816_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b for one 16x8 tile with k = 32, e4m3 in (4 consecutive k per register), fp32 accumulate.
__device__ __forceinline__ void mma_16832_e4m3(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to e4m3 (round to nearest, saturating to +-448): lo in byte 0, hi in byte 1.
__device__ __forceinline__ unsigned short pack_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four floats to e4m3 (as pack_e4m3x2): x in byte 0 .. w in byte 3.
__device__ __forceinline__ unsigned pack_e4m3x4(float4 v) {
    return pack_e4m3x2(v.x, v.y) | (unsigned(pack_e4m3x2(v.z, v.w)) << 16);
}

// The two e4m3 values in the low 16 bits of v as f16x2 (byte 0 in the low half); exact.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned v) {
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<unsigned short>(v)));
    return r;
}

// The four e4m3 values of v (byte 0 first) as two f16x2 words: bytes 0-1 in .x, bytes 2-3 in .y;
// exact. sm_90's ptxas shifts `v >> 16` down before converting it; named as v's upper half it
// converts that pair in place (sm_120's ptxas does so from either form, which keeps its SASS).
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(unsigned v) {
#if __CUDA_ARCH__ >= 1000
    return {e4m3x2_to_f16x2(v), e4m3x2_to_f16x2(v >> 16)};
#else
    uint2 r;
    asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
        : "=r"(r.x), "=r"(r.y)
        : "r"(v));
    return r;
#endif
}

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// a * b of two f16x2 words, rounded once per half.
__device__ __forceinline__ unsigned hmul2(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// ---- vectors of 8 elements, the unit of the memory-bound kernels ----

__device__ __forceinline__ void load8(float (&v)[8], const float* p) {
    float4 a = reinterpret_cast<const float4*>(p)[0];
    float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void load8(float (&v)[8], const bf16* p) {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
    uint4 raw;
    raw.x = pack_bf16x2(v[0], v[1]);
    raw.y = pack_bf16x2(v[2], v[3]);
    raw.z = pack_bf16x2(v[4], v[5]);
    raw.w = pack_bf16x2(v[6], v[7]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// ---- 2 and 4 values of a partial state's o: fp32, or bf16 where the plan halves its bytes ----

__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) { *reinterpret_cast<unsigned*>(p) = pack_bf16x2(a, b); }

__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
    *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(bf16* p, float a, float b, float c, float d) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(a, b), pack_bf16x2(c, d));
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const bf16* p) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

}  // namespace kgen
