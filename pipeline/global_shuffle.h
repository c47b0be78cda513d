// The global shuffle's order: a seeded bijection over [0, n).
//
// A balanced Feistel network over the smallest even number of bits that
// covers n, with cycle-walking (re-encrypt until the value falls below n)
// to stay inside [0, n).  It needs O(1) memory whatever n is, which is what
// lets an epoch over billions of records be reshuffled uniformly without a
// permutation array, and lets any position of the epoch be computed
// directly (so the state of a reader is just a position).
#ifndef RECFLOW_PIPELINE_GLOBAL_SHUFFLE_H_
#define RECFLOW_PIPELINE_GLOBAL_SHUFFLE_H_

#include <array>
#include <cstdint>

namespace recflow::pipeline {

class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t n, uint64_t seed);
  uint64_t size() const { return n_; }
  // The image of i < size(); a bijection of [0, size()).
  uint64_t operator()(uint64_t i) const;

 private:
  static constexpr int kRounds = 6;
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  std::array<uint64_t, kRounds> keys_;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_GLOBAL_SHUFFLE_H_
