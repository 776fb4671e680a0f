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
};

enum class BwdNamedBarrier : int {
  kPdSReady = 1,  // all consumer warpgroups wrote their part of P^T and dS^T to shared memory
  kDqTurn = 2,    // SS, deterministic mode: this CTA's turn to add into a dQ block / its additions done
  kDqFull = 3,    // RS: the consumers wrote this step's dQ block to shared memory (+ 32 reducer threads)
  kDqEmpty = 4,   // RS: the reducer warp has read it, the buffer is free again
};

}  // namespace flash
