// Hopper (sm_90a) helpers: warpgroup MMA (wgmma) on shared-memory descriptors, register
// reallocation between warpgroups, and 16-byte cp.async completing on an mbarrier.
// NVRTC-safe; only the sm_90 attention loops (through wgmma_ring.cuh) include it.
//
// wgmma m64nNk16 register fragments are those of mma.sync m16n8k16, one 16-row slice per warp of
// the warpgroup (g = lane / 4, t = lane % 4): A holds rows (g, g + 8) x k (2t, 2t + 1, 2t + 8,
// 2t + 9) of the warp's slice; accumulator registers 4i .. 4i + 3 hold rows (g, g, g + 8, g + 8) x
// columns (8i + 2t, 8i + 2t + 1).
#pragma once
#include "kgen/common.cuh"

namespace kgen {

// Descriptor of a 128-byte-swizzled shared-memory operand: start address, leading and stride
// byte offsets (each >> 4 in bits 0-13, 16-29, 32-45), swizzle mode 1 (128 B) in bits 62-63. The
// swizzle XORs address bits 4-6 with bits 7-9, so operand tiles start 1024-byte aligned.
__device__ __forceinline__ unsigned long long sw128_desc(const void* smem, unsigned lead_bytes, unsigned stride_bytes) {
    const unsigned long long start = (smem_addr(smem) & 0x3ffff) >> 4;
    return start | (unsigned long long)((lead_bytes & 0x3ffff) >> 4) << 16 |
           (unsigned long long)((stride_bytes & 0x3ffff) >> 4) << 32 | 1ull << 62;
}

// Byte offset of 16-byte chunk `chunk` (of 8) of row `row` in a 128-byte-swizzled block of rows.
__device__ __forceinline__ int sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) << 4); }

// Orders this thread's register writes before the next wgmma reads them (A fragments, accumulators).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Makes generic-proxy writes to shared memory (cp.async, st.shared) visible to wgmma's reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Give registers back to / take registers from the CTA's pool (whole warpgroups, multiples of 8).
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// 16 bytes global -> shared, through L2 only.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// The same through L1 (.ca): for rows read more than once by a CTA (a tile's padding rows repeat
// its last query row; through L2 alone, 132 CTAs' repeats of one row serialize there).
__device__ __forceinline__ void cp_async16_l1(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// Arrive on `bar` once every cp.async this thread issued so far has landed (counts as one of the
// barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive(mbarrier* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// wgmma's accumulator operands: the placeholders of a 16-, 64- or 128-float accumulator (operands 0 ..
// N - 1, so the A, B and predicate operands follow at N) and the read-write constraints of 8 floats.
#define KGEN_WG_D16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define KGEN_WG_D64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KGEN_WG_D128 \
    KGEN_WG_D64 "," \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define KGEN_WG_ACC8(d, i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define KGEN_WG_ACC64(d)                                                                                          \
    KGEN_WG_ACC8(d, 0), KGEN_WG_ACC8(d, 8), KGEN_WG_ACC8(d, 16), KGEN_WG_ACC8(d, 24), KGEN_WG_ACC8(d, 32), \
        KGEN_WG_ACC8(d, 40), KGEN_WG_ACC8(d, 48), KGEN_WG_ACC8(d, 56)

// d = a * b (+ d if accumulate): M=64, N=32, K=16; A from registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], const unsigned (&a)[4], unsigned long long b_desc,
                                               bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" KGEN_WG_D16
                 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : KGEN_WG_ACC8(d, 0), KGEN_WG_ACC8(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=32, K=16; A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], unsigned long long a_desc, unsigned long long b_desc,
                                                   bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" KGEN_WG_D16
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : KGEN_WG_ACC8(d, 0), KGEN_WG_ACC8(d, 8)
                 : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=256, K=16; A from registers, B N-major (transposed) in
// shared memory; d's columns 0..127 in lo, 128..255 in hi (an N=128 accumulator each).
__device__ __forceinline__ void wgmma_m64n256k16_bt(float (&lo)[64], float (&hi)[64], const unsigned (&a)[4],
                                                   unsigned long long b_desc, bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" KGEN_WG_D128
                 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : KGEN_WG_ACC64(lo), KGEN_WG_ACC64(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

// The same with A (K-major) in shared memory too: a probability tile another warpgroup wrote.
__device__ __forceinline__ void wgmma_m64n256k16_ss_bt(float (&lo)[64], float (&hi)[64], unsigned long long a_desc,
                                                      unsigned long long b_desc, bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" KGEN_WG_D128
                 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : KGEN_WG_ACC64(lo), KGEN_WG_ACC64(hi)
                 : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=128, K=16; A from registers, B N-major (transposed) in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_bt(float (&d)[64], const unsigned (&a)[4], unsigned long long b_desc,
                                                   bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KGEN_WG_D64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : KGEN_WG_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

// The same with A (K-major) in shared memory too.
__device__ __forceinline__ void wgmma_m64n128k16_ss_bt(float (&d)[64], unsigned long long a_desc, unsigned long long b_desc,
                                                      bool accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KGEN_WG_D64
                 "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
                 : KGEN_WG_ACC64(d)
                 : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)));
}

}  // namespace kgen
