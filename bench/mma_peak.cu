// The mma.sync ceiling: back-to-back independent m16n8k16 bf16 -> fp32 MMAs on register operands.
//
// Every warp keeps NACC independent accumulators (so the tensor pipe never waits on an MMA's
// latency) and issues ITERS x NACC MMAs; no memory traffic except one store per thread at the
// end (which also keeps the accumulators live). One MMA is 2 * 16 * 8 * 16 = 4096 FLOPs.
// Compiled by bench/ceilings.py through kgen's NVRTC path (kgen.nvrtc.compile_cubin).

#ifndef NACC
#define NACC 8
#endif

extern "C" __global__ void __launch_bounds__(256) mma_peak(float* __restrict__ out, int iters) {
    // bf16 operands from the thread index so nothing folds: 2^-7 and 2^-8 (products stay tiny).
    const unsigned lane = threadIdx.x & 31u;
    const unsigned a = 0x3c003c00u | (lane & 1u);        // bf16 pair ~0.0078
    const unsigned b = 0x3b803b80u | ((lane >> 1) & 1u);  // bf16 pair ~0.0039
    float acc[NACC][4];
#pragma unroll
    for (int j = 0; j < NACC; ++j) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    }
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                : "r"(a), "r"(a ^ 1u), "r"(a), "r"(a ^ 1u), "r"(b), "r"(b ^ 1u));
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NACC; ++j) {
        s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
