// The trace dev knob (policy.h; default 0: no code): SM clock stamps of CTA 0's producer and
// consumer events in the FP8 forward, printed by its first consumer thread at the end of the third
// launch, and every CTA's %globaltimer start and end, printed at the fourth; tools/profile/trace_report.py
// reads them (docs/decisions/100-fp8-h128-tile-timeline.md).
#pragma once

#include <cstdint>
#include <cstdio>

#include "kernel/common/policy.h"  // FLASH_KERNEL_TRACE

namespace flash {

enum class TraceEvent : uint32_t {
  kLoad = 1,      // producer: block's V and K TMA loads issued
  kQ = 2,         // producer: Q's TMA load issued (after Q's buffer was released)
  kVLanded = 3,   // producer: V stage landed (transpose may read it)
  kVtFree = 4,    // producer: V^T stage free (transpose may write it)
  kTDone = 5,     // producer: V^T stage committed
  kTile = 10,     // consumer: tile begins (before Q's wait)
  kQReady = 11,   // consumer: Q landed
  kTurn = 12,     // consumer: ping-pong turn begins
  kK = 13,        // consumer: K stage landed
  kV = 14,        // consumer: V^T stage landed
  kS = 15,        // consumer: S GEMM done
  kPV = 16,       // consumer: P.V GEMM done
  kEpi = 17,      // consumer: epilogue stored O
};

#if FLASH_KERNEL_TRACE
static __device__ uint32_t g_fwd_trace[3][2 * 4096];  // role (producer, consumer wg 0, 1): (event, clock)
static __device__ int g_fwd_trace_launch;

CUTLASS_DEVICE int* trace_counts() {  // per role, zeroed at the kernel's start
  __shared__ int count[3];
  return count;
}
// role 0: the producer's first thread; role 1 + w: consumer warpgroup w's first thread.
CUTLASS_DEVICE void trace(int role, TraceEvent e) {
  if (blockIdx.x != 0 || role > 2) { return; }
  int const i = trace_counts()[role]++;
  if (i < 4096) {
    g_fwd_trace[role][2 * i] = uint32_t(e);
    g_fwd_trace[role][2 * i + 1] = uint32_t(clock());
  }
}
// Every CTA's first consumer thread: %globaltimer at its start and end, per launch parity.
static __device__ unsigned long long g_fwd_cta[2][1024][2];
CUTLASS_DEVICE unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
CUTLASS_DEVICE int trace_launch() { return *reinterpret_cast<int volatile*>(&g_fwd_trace_launch); }
CUTLASS_DEVICE void trace_cta(int launch, int end) {
  if (blockIdx.x < 1024) { g_fwd_cta[launch & 1][blockIdx.x][end] = globaltimer(); }
}
// By consumer thread 0 of CTA 0 once both consumer warpgroups are done (the producer is by then):
// at the third launch CTA 0's stamps, at the fourth every CTA's start and end of the third.
CUTLASS_DEVICE void trace_print() {
  if (blockIdx.x != 0) { return; }
  int const launch = atomicAdd(&g_fwd_trace_launch, 1);
  if (launch == 2) {
    for (int role = 0; role < 3; ++role) {
      int const n = trace_counts()[role] < 4096 ? trace_counts()[role] : 4096;
      for (int i = 0; i < n; ++i) {
        printf("TRACE %d %u %u\n", role, g_fwd_trace[role][2 * i], g_fwd_trace[role][2 * i + 1]);
      }
    }
  } else if (launch == 3) {
    for (int i = 0; i < int(gridDim.x) && i < 1024; ++i) {
      printf("CTA %d %llu %llu\n", i, g_fwd_cta[0][i][0], g_fwd_cta[0][i][1]);
    }
  }
}
#define FLASH_TRACE(role, e) ::flash::trace((role), ::flash::TraceEvent::e)
// The kernel shell's hooks: counters zeroed before its first barrier; each CTA's start by its first
// consumer thread; at the consumers' end (after both warpgroups' last stamps) the end and the print.
#define FLASH_TRACE_INIT() \
  if (threadIdx.x < 3) { ::flash::trace_counts()[threadIdx.x] = 0; }
#define FLASH_TRACE_CTA_START(on)           \
  int const trace_launch_id = ::flash::trace_launch(); \
  if ((on) && threadIdx.x == 128) { ::flash::trace_cta(trace_launch_id, 0); }
#define FLASH_TRACE_CTA_END(on, consumer_threads)                               \
  if (on) {                                                                     \
    cutlass::arch::NamedBarrier::sync((consumer_threads), 7); /* hardware barrier 15 */ \
    if (threadIdx.x == 128) {                                                   \
      ::flash::trace_cta(trace_launch_id, 1);                                   \
      ::flash::trace_print();                                                   \
    }                                                                           \
  }
#else
#define FLASH_TRACE(role, e) ((void)0)
#define FLASH_TRACE_INIT() ((void)0)
#define FLASH_TRACE_CTA_START(on) ((void)0)
#define FLASH_TRACE_CTA_END(on, consumer_threads) ((void)0)
#endif

}  // namespace flash
