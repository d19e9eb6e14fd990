// Hopper (sm_90a) helpers: warpgroup MMA (wgmma) on shared-memory descriptors, register
// reallocation between warpgroups, and 16-byte cp.async completing on an mbarrier.
// NVRTC-safe; only the sm_90 attention loop (attention_wgmma.cuh) includes it.
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

// d = a * b (+ d if accumulate): M=64, N=32, K=16; A from registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], const unsigned (&a)[4], unsigned long long b_desc,
                                               bool accumulate) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=32, K=16; A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], unsigned long long a_desc, unsigned long long b_desc,
                                                   bool accumulate) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=256, K=16; A from registers, B N-major (transposed) in
// shared memory; d's columns 0..127 in lo, 128..255 in hi (an N=128 accumulator each).
__device__ __forceinline__ void wgmma_m64n256k16_bt(float (&lo)[64], float (&hi)[64], const unsigned (&a)[4],
                                                   unsigned long long b_desc, bool accumulate) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : "+f"(lo[0]), "+f"(lo[1]), "+f"(lo[2]), "+f"(lo[3]), "+f"(lo[4]), "+f"(lo[5]), "+f"(lo[6]), "+f"(lo[7]),
          "+f"(lo[8]), "+f"(lo[9]), "+f"(lo[10]), "+f"(lo[11]), "+f"(lo[12]), "+f"(lo[13]), "+f"(lo[14]), "+f"(lo[15]),
          "+f"(lo[16]), "+f"(lo[17]), "+f"(lo[18]), "+f"(lo[19]), "+f"(lo[20]), "+f"(lo[21]), "+f"(lo[22]), "+f"(lo[23]),
          "+f"(lo[24]), "+f"(lo[25]), "+f"(lo[26]), "+f"(lo[27]), "+f"(lo[28]), "+f"(lo[29]), "+f"(lo[30]), "+f"(lo[31]),
          "+f"(lo[32]), "+f"(lo[33]), "+f"(lo[34]), "+f"(lo[35]), "+f"(lo[36]), "+f"(lo[37]), "+f"(lo[38]), "+f"(lo[39]),
          "+f"(lo[40]), "+f"(lo[41]), "+f"(lo[42]), "+f"(lo[43]), "+f"(lo[44]), "+f"(lo[45]), "+f"(lo[46]), "+f"(lo[47]),
          "+f"(lo[48]), "+f"(lo[49]), "+f"(lo[50]), "+f"(lo[51]), "+f"(lo[52]), "+f"(lo[53]), "+f"(lo[54]), "+f"(lo[55]),
          "+f"(lo[56]), "+f"(lo[57]), "+f"(lo[58]), "+f"(lo[59]), "+f"(lo[60]), "+f"(lo[61]), "+f"(lo[62]), "+f"(lo[63]),
          "+f"(hi[0]), "+f"(hi[1]), "+f"(hi[2]), "+f"(hi[3]), "+f"(hi[4]), "+f"(hi[5]), "+f"(hi[6]), "+f"(hi[7]),
          "+f"(hi[8]), "+f"(hi[9]), "+f"(hi[10]), "+f"(hi[11]), "+f"(hi[12]), "+f"(hi[13]), "+f"(hi[14]), "+f"(hi[15]),
          "+f"(hi[16]), "+f"(hi[17]), "+f"(hi[18]), "+f"(hi[19]), "+f"(hi[20]), "+f"(hi[21]), "+f"(hi[22]), "+f"(hi[23]),
          "+f"(hi[24]), "+f"(hi[25]), "+f"(hi[26]), "+f"(hi[27]), "+f"(hi[28]), "+f"(hi[29]), "+f"(hi[30]), "+f"(hi[31]),
          "+f"(hi[32]), "+f"(hi[33]), "+f"(hi[34]), "+f"(hi[35]), "+f"(hi[36]), "+f"(hi[37]), "+f"(hi[38]), "+f"(hi[39]),
          "+f"(hi[40]), "+f"(hi[41]), "+f"(hi[42]), "+f"(hi[43]), "+f"(hi[44]), "+f"(hi[45]), "+f"(hi[46]), "+f"(hi[47]),
          "+f"(hi[48]), "+f"(hi[49]), "+f"(hi[50]), "+f"(hi[51]), "+f"(hi[52]), "+f"(hi[53]), "+f"(hi[54]), "+f"(hi[55]),
          "+f"(hi[56]), "+f"(hi[57]), "+f"(hi[58]), "+f"(hi[59]), "+f"(hi[60]), "+f"(hi[61]), "+f"(hi[62]), "+f"(hi[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

// d = a * b (+ d if accumulate): M=64, N=128, K=16; A from registers, B N-major (transposed) in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_bt(float (&d)[64], const unsigned (&a)[4], unsigned long long b_desc,
                                                   bool accumulate) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)));
}

}  // namespace kgen
