// Named hardware barrier ids (bar.sync id, count). Id 0 is __syncthreads.
#pragma once

namespace flash {

enum class FwdNamedBarrier : int {
  kEpilogueWG1 = 1,  // + consumer warpgroup index: that warpgroup's O tile is in shared memory
  kEpilogueWG2 = 2,
  kEpilogueWG3 = 3,
};

}  // namespace flash
