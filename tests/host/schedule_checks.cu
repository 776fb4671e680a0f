// Host-only checks of the kernels' scheduling arithmetic, on the real headers:
// 1. Deterministic backward: for every dQ block, the key blocks whose CTA visits it
//    (BwdBlockRange) take turns 0..k-1 exactly once (dq_turn), so no CTA waits for a turn that
//    never comes and no two add at once; with a causal/local mask the turns run from the highest
//    key block down, and those CTAs are launched first (key_block_of_cta reverses the order).
// 2. Forward tile scheduler: decode maps the tile ids onto every (m_block, head, batch) exactly
//    once, and the causal persistent order is heaviest first inside each group of heads.
// 3. The forward's dynamic tile counter: the binding and the launched kernel agree on it.
// 4. Forward block range: every key a tile's rows see lies in the visited key blocks, and a block
//    the range calls unmasked holds only keys that every row of the tile sees.
// 5. Varlen sequence extents: whatever cu_seqlens / seqused hold, every sequence lies inside the
//    packed tensors and its padded rows inside the backward's workspace; for well-formed offsets
//    the sequences are the segments asked for and their padded rows do not overlap.
// Random shapes from a fixed seed; prints a summary and exits non-zero on any failure.
#include "kernel/bwd/kernel.h"
#include "kernel/common/block_range.h"
#include "kernel/common/seqlen.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/fwd/kernel.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

namespace {

std::mt19937 rng(20261130);
int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// kHeadDim: 64 (128-query steps, 128 keys), 128 (64 x 128) or 256 (64 x 64), as policy.h picks.
template <int kHeadDim, bool kLocal>
int check_dq_turns(int cases) {
  using Kernel = flash::BwdKernelFor<kHeadDim, cutlass::bfloat16_t, kLocal, /*kDeterministic=*/true>;
  constexpr int kBlockM = Kernel::kBlockM;
  constexpr int kBlockN = Kernel::kBlockN;
  int failures = 0;
  for (int c = 0; c < cases; ++c) {
    typename Kernel::Params params{};
    int const seqlen_q = uniform(1, 1500), seqlen_k = uniform(1, 1500);
    params.seqlen_q = seqlen_q;
    params.seqlen_k = seqlen_k;
    int const unbounded = seqlen_q + seqlen_k;  // as the binding stores an open side
    params.diag_offset = uniform(0, 1) ? seqlen_k - seqlen_q : 0;  // bottom-right or top-left
    params.window_left = uniform(0, 2) ? unbounded : uniform(0, 400);
    params.window_right = uniform(0, 2) ? 0 : (uniform(0, 1) ? unbounded : uniform(0, 400));
    if (!kLocal) { params.window_left = params.window_right = unbounded; }
    int const num_n = (seqlen_k + kBlockN - 1) / kBlockN;
    int const num_m = (seqlen_q + kBlockM - 1) / kBlockM;
    std::vector<std::vector<int>> contributors(num_m);
    for (int n = 0; n < num_n; ++n) {
      flash::BwdBlockRange<kBlockM, kBlockN, kLocal> const range(n, seqlen_q, params.diag_offset,
                                                                 params.window_left, params.window_right);
      for (int m = range.m_block_min; m < range.m_block_min + range.count(); ++m) {
        if (m < 0 || m >= num_m) { ++failures; continue; }
        contributors[m].push_back(n);
      }
    }
    for (int m = 0; m < num_m; ++m) {
      std::vector<std::pair<int, int>> turns;  // (turn, n)
      for (int n : contributors[m]) { turns.push_back({Kernel::DqReducer::dq_turn(m, n, params), n}); }
      std::sort(turns.begin(), turns.end());
      bool ok = true;
      for (size_t i = 0; i < turns.size(); ++i) {
        ok &= turns[i].first == int(i);
        // Deadlock freedom: a CTA waits only for CTAs launched before it. Launch position of key
        // block n: num_n - 1 - n with a causal/local mask (descending turns), n otherwise.
        if (i > 0) { ok &= kLocal ? turns[i].second < turns[i - 1].second : turns[i].second > turns[i - 1].second; }
      }
      if (!ok && failures++ < 5) {
        std::printf("dq turns wrong: kBlockN %d local %d seqlen_q %d seqlen_k %d diag %d left %d right %d m %d\n",
                    kBlockN, int(kLocal), seqlen_q, seqlen_k, params.diag_offset, params.window_left,
                    params.window_right, m);
      }
    }
  }
  std::printf("dq turns (%d x %d steps, %s): %d random shapes, %d failures\n", kBlockM, kBlockN,
              kLocal ? "causal/local" : "no mask", cases, failures);
  return failures;
}

template <bool kPersistent, bool kHeavyLast>
int check_scheduler(int cases) {
  using Scheduler = flash::FwdTileScheduler<kPersistent, kHeavyLast>;
  int failures = 0;
  for (int c = 0; c < cases; ++c) {
    int const num_m = uniform(1, 70), heads = uniform(1, 40), batch = uniform(1, 9), q_per_kv = uniform(1, 4);
    int const kv_heads_total = heads;  // heads here are query heads; groups are whole GQA groups
    int64_t const kv_bytes = int64_t(uniform(1, 16384)) * 128 * 2;
    int const group = Scheduler::heads_per_group(kv_heads_total, q_per_kv, batch, kv_bytes);
    Scheduler const scheduler(num_m, heads, batch, group);
    auto const divisors = Scheduler::divisors(num_m, heads, group);
    std::vector<char> seen(size_t(num_m) * heads * batch, 0);
    int prev_group = -1, prev_m = 0;
    bool ok = group >= 1;
    for (int tile = 0; tile < scheduler.num_tiles; ++tile) {
      flash::FwdTile const t = scheduler.decode(tile, divisors);
      bool const in = t.m_block >= 0 && t.m_block < num_m && t.head >= 0 && t.head < heads && t.batch >= 0 &&
                      t.batch < batch;
      if (!in) { ok = false; break; }
      // The same order written with plain integer division (decode uses FastDivmod).
      int ref_m, ref_hb;
      if (Scheduler::kGrouped) {
        int const g = tile / (num_m * group), rest = tile % (num_m * group);
        int const hbs = std::min(group, heads * batch - g * group);
        ref_m = num_m - 1 - rest / hbs;
        ref_hb = g * group + rest % hbs;
      } else {
        ref_m = kHeavyLast ? num_m - 1 - tile % num_m : tile % num_m;
        ref_hb = tile / num_m;
      }
      ok &= t.m_block == ref_m && t.head == ref_hb % heads && t.batch == ref_hb / heads;
      char& s = seen[(size_t(t.batch) * heads + t.head) * num_m + t.m_block];
      ok &= s == 0;
      s = 1;
      if (Scheduler::kGrouped) {  // heaviest first inside a group: m_block never grows
        int const g = (t.batch * heads + t.head) / group;
        if (g == prev_group) { ok &= t.m_block <= prev_m; }
        prev_group = g;
        prev_m = t.m_block;
      }
    }
    if (!ok && failures++ < 5) {
      std::printf("scheduler wrong: persistent %d heavy_last %d num_m %d heads %d batch %d group %d\n",
                  int(kPersistent), int(kHeavyLast), num_m, heads, batch, group);
    }
  }
  std::printf("tile scheduler (persistent %d, heaviest first %d): %d random shapes, %d failures\n",
              int(kPersistent), int(kHeavyLast), cases, failures);
  return failures;
}

// 3. The binding allocates the dynamic scheduler's tile counter when policy.h's
//    fwd_needs_tile_counter says so; the kernel the dispatch launches must agree, at every
//    (head dim, mask, key-length class), or the launch refuses to run without a counter.
template <int kHeadDim, bool kLocal>
int check_tile_counter_agreement() {
  int failures = 0;
  int const seqlens[] = {1, flash::kFwdMidKeysFrom - 1, flash::kFwdMidKeysFrom, flash::kFwdLongKeysFrom - 1,
                         flash::kFwdLongKeysFrom, 8192, 8448, 1 << 20};
  for (int seqlen_k : seqlens) {
    flash::FwdKeys const keys = flash::fwd_keys_class_for<kHeadDim, kLocal>(seqlen_k);  // as the dispatch
    bool const kernel_dynamic =
        keys == flash::kLongKeys  ? flash::FwdKernelFor<kHeadDim, cutlass::bfloat16_t, kLocal, flash::kLongKeys>::kDynamic
        : keys == flash::kMidKeys ? flash::FwdKernelFor<kHeadDim, cutlass::bfloat16_t, kLocal, flash::kMidKeys>::kDynamic
                                  : flash::FwdKernelFor<kHeadDim, cutlass::bfloat16_t, kLocal, flash::kShortKeys>::kDynamic;
    if (kernel_dynamic != flash::fwd_needs_tile_counter(kHeadDim, kLocal, seqlen_k)) {
      std::printf("tile counter disagreement: hdim %d local %d seqlen_k %d kernel %d binding %d\n", kHeadDim,
                  int(kLocal), seqlen_k, int(kernel_dynamic), int(!kernel_dynamic));
      ++failures;
    }
  }
  return failures;
}

int check_tile_counters() {
  int const failures = check_tile_counter_agreement<64, false>() + check_tile_counter_agreement<64, true>() +
                       check_tile_counter_agreement<96, false>() + check_tile_counter_agreement<96, true>() +
                       check_tile_counter_agreement<128, false>() + check_tile_counter_agreement<128, true>() +
                       check_tile_counter_agreement<192, false>() + check_tile_counter_agreement<192, true>() +
                       check_tile_counter_agreement<256, false>() + check_tile_counter_agreement<256, true>();
  std::printf("forward tile counter (binding vs kernel): 10 head dim x mask pairs, 8 key lengths each: %d failures\n",
              failures);
  // The long-tile ratio rule at hdim 128 non-causal (128x176 long, 128x128 mid): 8192 pads to 8272
  // with 176-key blocks, none with 128; 8448 is whole in both (a tie keeps the long tile); 10000
  // pads 32 keys with 176 and 112 with 128; 4095 is below the long class.
#if FLASH_FWD_LONG_TILE_RATIO == 1000
  struct { int seqlen_k; flash::FwdKeys want; } const rule[] = {
      {8192, flash::kMidKeys}, {8448, flash::kLongKeys}, {10000, flash::kLongKeys}, {16384, flash::kMidKeys},
      {flash::kFwdLongKeysFrom - 1, flash::kMidKeys}};
  int rule_failures = 0;
  for (auto const& c : rule) {
    if (flash::fwd_keys_class_for<128, false>(c.seqlen_k) != c.want) {
      std::printf("long-tile rule wrong at hdim 128 seqlen_k %d\n", c.seqlen_k);
      ++rule_failures;
    }
  }
  std::printf("long-tile ratio rule: %d failures\n", rule_failures);
  return failures + rule_failures;
#else
  return failures;
#endif
}

template <int kBlockM, int kBlockN, bool kLocal>
int check_fwd_block_range(int cases) {
  int failures = 0;
  for (int c = 0; c < cases; ++c) {
    int const seqlen_q = uniform(1, 700), seqlen_k = uniform(1, 700);
    int const unbounded = seqlen_q + seqlen_k;  // as the binding stores an open side
    int const diag = uniform(0, 1) ? seqlen_k - seqlen_q : 0;  // bottom-right or top-left
    int left = uniform(0, 2) ? unbounded : uniform(0, 300);
    int right = uniform(0, 2) ? 0 : (uniform(0, 1) ? unbounded : uniform(0, 300));
    if (!kLocal) { left = right = unbounded; }
    auto sees = [&](int i, int j) { return j >= 0 && j < seqlen_k && i + diag - left <= j && j <= i + diag + right; };
    int const num_m = (seqlen_q + kBlockM - 1) / kBlockM;
    bool ok = true;
    for (int m = 0; m < num_m && ok; ++m) {
      flash::BlockRange<kBlockM, kBlockN, kLocal> const range(m, seqlen_q, seqlen_k, diag, left, right);
      int const first_row = m * kBlockM, last_row = std::min((m + 1) * kBlockM, seqlen_q) - 1;
      for (int i = first_row; i <= last_row && ok; ++i) {
        for (int j = 0; j < seqlen_k; ++j) {
          if (sees(i, j) && (j / kBlockN < range.n_block_min || j / kBlockN >= range.n_block_max)) { ok = false; }
        }
      }
      for (int n = range.n_block_min; n < range.n_block_max && ok; ++n) {
        if (range.needs_mask(n)) { continue; }
        for (int i = first_row; i <= last_row; ++i) {
          for (int j = n * kBlockN; j < (n + 1) * kBlockN; ++j) { ok &= sees(i, j); }
        }
      }
      if (!ok && failures++ < 5) {
        std::printf("fwd block range wrong: %dx%d local %d seqlen_q %d seqlen_k %d diag %d left %d right %d m %d\n",
                    kBlockM, kBlockN, int(kLocal), seqlen_q, seqlen_k, diag, left, right, m);
      }
    }
  }
  std::printf("fwd block range (%d x %d, %s): %d random shapes, %d failures\n", kBlockM, kBlockN,
              kLocal ? "causal/local" : "no mask", cases, failures);
  return failures;
}

// Split-KV: for every split count, the splits' shares of a tile's key blocks (keep_split) are
// disjoint, contiguous, in order and together the whole range, and keep the mask bounds.
template <int kBlockM, int kBlockN, bool kLocal>
int check_split_ranges(int cases) {
  int failures = 0;
  for (int c = 0; c < cases; ++c) {
    int const seqlen_q = uniform(1, 300), seqlen_k = uniform(1, 5000);
    int const unbounded = seqlen_q + seqlen_k;
    int const left = kLocal && uniform(0, 1) ? uniform(0, 900) : unbounded;
    int const right = kLocal ? 0 : unbounded;
    int const splits = uniform(1, 300);
    int const num_m = (seqlen_q + kBlockM - 1) / kBlockM;
    bool ok = true;
    for (int m = 0; m < num_m; ++m) {
      flash::BlockRange<kBlockM, kBlockN, kLocal> const whole(m, seqlen_q, seqlen_k, seqlen_k - seqlen_q, left, right);
      int next = whole.n_block_min, covered = 0;
      for (int s = 0; s < splits; ++s) {
        flash::BlockRange<kBlockM, kBlockN, kLocal> part = whole;
        part.keep_split(s, splits);
        ok &= part.n_unmasked_lo == whole.n_unmasked_lo && part.n_unmasked_hi == whole.n_unmasked_hi;
        if (part.empty()) { continue; }
        ok &= part.n_block_min == next && part.n_block_max <= whole.n_block_max;
        covered += part.n_block_max - part.n_block_min;
        next = part.n_block_max;
      }
      ok &= covered == std::max(0, whole.n_block_max - whole.n_block_min);
    }
    if (!ok && failures++ < 5) {
      std::printf("split ranges wrong: seqlen_q %d seqlen_k %d left %d splits %d\n", seqlen_q, seqlen_k, left, splits);
    }
  }
  std::printf("split-KV ranges (%d x %d, %s): %d random shapes, %d failures\n", kBlockM, kBlockN,
              kLocal ? "causal/local" : "no mask", cases, failures);
  return failures;
}

struct VarlenOnly {
  flash::VarlenArgs varlen;
  int seqlen_k;  // the longest key length (varlen: max_seqlen_k), seqused_k's bound
};

int check_varlen_extents(int cases) {
  int failures = 0;
  constexpr int kPad = flash::kBwdPadM;
  for (int c = 0; c < cases; ++c) {
    int const batch = uniform(1, 40);
    bool const malformed = uniform(0, 2) == 0;
    std::vector<int> cu_q(batch + 1), cu_k(batch + 1), used_q(batch), used_k(batch);
    for (int b = 0; b < batch; ++b) {
      cu_q[b + 1] = cu_q[b] + (uniform(0, 3) ? uniform(0, 300) : uniform(0, 1));
      cu_k[b + 1] = cu_k[b] + uniform(0, 300);
      used_q[b] = uniform(0, 320);
      used_k[b] = uniform(0, 320);
    }
    int const total_q = cu_q[batch], total_k = cu_k[batch];
    if (malformed) {  // contents no host check could see without a sync
      for (int& x : cu_q) { x = uniform(-50, total_q + 50); }
      for (int& x : used_q) { x = uniform(-50, 400); }
    }
    bool const with_used = uniform(0, 1);
    int const max_k = uniform(0, 320);
    VarlenOnly p{{cu_q.data(), cu_k.data(), with_used ? used_q.data() : nullptr, with_used ? used_k.data() : nullptr,
                  total_q, total_k, false, batch}, max_k};
    int64_t const rows_padded = (int64_t(total_q) + int64_t(batch) * kPad + kPad - 1) / kPad * kPad;
    bool ok = true;
    int64_t prev_end = 0;
    for (int b = 0; b < batch; ++b) {
      flash::VarSeqLen<VarlenOnly> const seq(p, b);
      ok &= seq.offset_q() >= 0 && seq.seqlen_q() >= 0 && seq.offset_q() + seq.seqlen_q() <= total_q;
      ok &= seq.offset_k() >= 0 && seq.seqlen_k() >= 0 && seq.offset_k() + seq.seqlen_k() <= total_k;
      int64_t const padded = seq.offset_q_padded<kPad>();
      int64_t const end = padded + (seq.seqlen_q() + kPad - 1) / kPad * kPad;
      ok &= padded % kPad == 0 && padded >= 0 && end <= rows_padded;
      if (!malformed) {
        int const want_q = with_used ? std::min(used_q[b], cu_q[b + 1] - cu_q[b]) : cu_q[b + 1] - cu_q[b];
        // seqused_k: FA3's length from the offset, at most the longest key length and the tensor.
        int const want_k = with_used ? std::min({used_k[b], max_k, total_k - cu_k[b]}) : cu_k[b + 1] - cu_k[b];
        ok &= seq.offset_q() == cu_q[b] && seq.seqlen_q() == want_q && seq.offset_k() == cu_k[b];
        ok &= seq.seqlen_k() == want_k;
        ok &= padded >= prev_end;  // no overlap with the sequence before
        prev_end = end;
      }
    }
    if (!ok && failures++ < 5) { std::printf("varlen extents wrong: batch %d malformed %d\n", batch, int(malformed)); }
  }
  std::printf("varlen extents (clamping, padded rows): %d random shapes, %d failures\n", cases, failures);
  return failures;
}

}  // namespace

int main() {
  int failures = 0;
  failures += check_dq_turns<64, true>(3000);
  failures += check_dq_turns<64, false>(500);
  failures += check_dq_turns<128, true>(3000);
  failures += check_dq_turns<128, false>(500);
  failures += check_dq_turns<256, true>(3000);
  failures += check_dq_turns<256, false>(500);
  failures += check_scheduler<true, true>(2000);
  failures += check_scheduler<true, false>(500);
  failures += check_scheduler<false, true>(500);
  failures += check_scheduler<false, false>(500);
  failures += check_tile_counters();
  failures += check_fwd_block_range<128, 128, true>(400);
  failures += check_fwd_block_range<128, 64, true>(400);
  failures += check_fwd_block_range<192, 128, false>(200);
  failures += check_fwd_block_range<128, 176, false>(200);
  failures += check_split_ranges<128, 128, false>(300);
  failures += check_split_ranges<128, 80, true>(300);
  failures += check_varlen_extents(3000);
  return failures != 0;
}
