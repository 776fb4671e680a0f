// Named hardware barrier ids (bar.sync id, count). Id 0 is __syncthreads.
#pragma once

namespace flash {

// Warpgroup roles: warpgroup 0 produces (TMA loads, the dynamic schedulers' draws, the backward's
// dQ reduction) on few registers; warpgroups 1.. consume (MMAs, softmax, epilogue), 64 query
// rows (forward) or one warpgroup's share of the key block (backward) each.
enum class WarpGroupRole : int { kProducer = 0, kFirstConsumer = 1 };
// Warps of the producer warpgroup.
enum class ProducerWarpRole : int { kLoad = 0, kDqReducer = 1 };

enum class FwdNamedBarrier : int {
  kEpilogueWG1 = 1,  // + consumer warpgroup index: that warpgroup's O tile is in shared memory
  kEpilogueWG2 = 2,
  kEpilogueWG3 = 3,
  // Ping-pong: consumer warpgroup w may issue its GEMMs once warpgroup w-1 (cyclically) has
  // issued its own. 128 threads sync on their barrier + 128 arrive from the predecessor.
  kSchedulerWG1 = 4,
  kSchedulerWG2 = 5,
  kSchedulerWG3 = 6,
};
// cutlass::arch::NamedBarrier adds its reserved count (ReservedNamedBarriers::FirstUserBarrier,
// 8) to the ids above, so they occupy hardware barriers 9-14. Hardware ids 1-7 are reserved by
// CUTLASS for components these kernels do not use; the forward's raw barrier.red vote
// (kMaxFree, utils.h named_barrier_all) takes hardware ids kFwdVoteHwBarrier + warpgroup.
constexpr int kFwdVoteHwBarrier = 1;

enum class BwdNamedBarrier : int {
  kPdSReady = 1,  // all consumer warpgroups wrote their part of P^T and dS^T to shared memory
  // dQ staging buffer b (+ b): the consumers wrote a dQ block to it / the reducer warp has read it.
  // 256 consumer threads + the 32 of the reducer warp. With the backward's kDqPerWG, one buffer
  // and pair w (+ w) for consumer warpgroup w's half of it: 128 + 32 threads.
  kDqFull0 = 3,
  kDqFull1 = 4,
  kDqEmpty0 = 5,
  kDqEmpty1 = 6,
};

}  // namespace flash
