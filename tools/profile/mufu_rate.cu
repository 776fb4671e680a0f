// Throughput of MUFU forms on one GPU: elements per second for f32 and packed f16x2 / bf16x2 exp2 and tanh.
// nvcc -O3 -arch=sm_90a -o mufu_rate tools/profile/mufu_rate.cu && ./mufu_rate
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define ITERS 4096
template <int OP>
__global__ void k(unsigned* out, unsigned seed) {
  unsigned r[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] = seed ^ (threadIdx.x * 7919u + i * 104729u);
  if (OP == 0 || OP == 3) {
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = __float_as_uint(-float(r[i] & 1023) / 1024.f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = 0xB800B800u ^ (r[i] & 0x00FF00FFu);
  }
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(r[i]));
      if (OP == 1) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(r[i]));
      if (OP == 2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(r[i]));
      if (OP == 3) asm volatile("tanh.approx.f32 %0, %0;" : "+r"(r[i]));
      if (OP == 4) asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(r[i]));
      if (OP == 5) asm volatile("tanh.approx.bf16x2 %0, %0;" : "+r"(r[i]));
    }
  }
  unsigned s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s ^= r[i];
  if (s == 0x12345678u) out[0] = s;
}
template <int OP>
void run(const char* name, int elems_per_op, unsigned* out, int sms) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  int blocks = sms * 8, threads = 256;
  k<OP><<<blocks, threads>>>(out, 1);
  cudaEventRecord(a);
  k<OP><<<blocks, threads>>>(out, 2);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  double ops = double(blocks) * threads * ITERS * 8;
  int khz; cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  printf("%-22s %8.3f ms  %7.1f G instr-lanes/s  %7.1f G elements/s  (%.2f elements/clk/SM at %d MHz max)\n", name, ms,
         ops / ms / 1e6, ops * elems_per_op / ms / 1e6, ops * elems_per_op / (ms * 1e-3) / sms / (khz * 1e3), khz / 1000);
}
int main() {
  unsigned* out; cudaMalloc(&out, 4);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int rep = 0; rep < 2; ++rep) {
    run<0>("ex2.approx.ftz.f32", 1, out, sms);
    run<1>("ex2.approx.f16x2", 2, out, sms);
    run<2>("ex2.approx.ftz.bf16x2", 2, out, sms);
    run<3>("tanh.approx.f32", 1, out, sms);
    run<4>("tanh.approx.f16x2", 2, out, sms);
    run<5>("tanh.approx.bf16x2", 2, out, sms);
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
