// The fp8 conversion ceiling: back-to-back e4m3x2 -> f16x2 conversions (cvt.rn.f16x2.e4m3x2, the
// F2FP.F16.E4M3.UNPACK_B of the fp8 attention loops) on registers.
//
// Every thread keeps CHAINS independent chains (each conversion reads the previous result of its
// chain, so nothing is hoisted) and runs ITERS x CHAINS conversions; one store per thread at the
// end keeps them live. Compiled by bench/ceilings.py through kgen's NVRTC path.

#ifndef CHAINS
#define CHAINS 8
#endif

extern "C" __global__ void __launch_bounds__(256) cvt_peak(float* __restrict__ out, int iters) {
    unsigned v[CHAINS];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) v[j] = threadIdx.x * (j + 1);
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j)
            asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(v[j]) : "h"(static_cast<unsigned short>(v[j])));
    }
    unsigned s = 0;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) s ^= v[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = __uint_as_float(s);
}
