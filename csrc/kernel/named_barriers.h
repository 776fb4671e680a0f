// Named hardware barrier ids (bar.sync id, count). Id 0 is __syncthreads.
#pragma once

namespace flash {

enum class FwdNamedBarrier : int {
  kEpilogueWG1 = 1,  // + consumer warpgroup index: that warpgroup's O tile is in shared memory
  kEpilogueWG2 = 2,
  kEpilogueWG3 = 3,
  // Ping-pong: consumer warpgroup w may issue its GEMMs once warpgroup w-1 (cyclically) has
  // issued its own. 128 threads sync on their barrier + 128 arrive from the predecessor.
  kSchedulerWG1 = 4,
  kSchedulerWG2 = 5,
  kSchedulerWG3 = 6,
  // kMaxFree: the warpgroup's vote on whether a key block needs its S computed again.
  kVoteWG1 = 7,
  kVoteWG2 = 8,
  kVoteWG3 = 9,
};

enum class BwdNamedBarrier : int {
  kPdSReady = 1,  // all consumer warpgroups wrote their part of P^T and dS^T to shared memory
  // dQ staging buffer b (+ b): the consumers wrote a dQ block to it / the reducer warp has read it.
  // 256 consumer threads + the 32 of the reducer warp.
  kDqFull0 = 3,
  kDqFull1 = 4,
  kDqEmpty0 = 5,
  kDqEmpty1 = 6,
};

}  // namespace flash
