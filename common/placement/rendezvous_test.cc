#include "common/placement/rendezvous.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tlsprof::placement {
namespace {

std::vector<std::string> Targets(int n) {
  std::vector<std::string> t;
  for (int i = 0; i < n; ++i) t.push_back("tlsprof-collector-" + std::to_string(i) + ".tlsprof-collector:4317");
  return t;
}

TEST(Rendezvous, TheOrderIsAPermutationAndStable) {
  auto targets = Targets(5);
  auto order = RendezvousOrder("agent-17.example.net", targets);
  ASSERT_EQ(order.size(), 5u);
  std::vector<size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(order, RendezvousOrder("agent-17.example.net", targets));
  // The order of the list given does not matter: the same target comes first.
  std::vector<std::string> reversed(targets.rbegin(), targets.rend());
  EXPECT_EQ(reversed[RendezvousOrder("agent-17.example.net", reversed)[0]], targets[order[0]]);
}

// Fixed values: the agent and the loadgen (and every release) must agree.
TEST(Rendezvous, ScoresAreFixed) {
  EXPECT_EQ(RendezvousScore("", ""), RendezvousScore("", ""));
  EXPECT_NE(RendezvousScore("ab", "c"), RendezvousScore("a", "bc"));
  EXPECT_EQ(RendezvousOrder("agent-1", Targets(3)), RendezvousOrder("agent-1", Targets(3)));
  // Computed by an independent implementation (Python) of the same definition.
  EXPECT_EQ(RendezvousScore("agent-1", "c0"), 0xf102d6cf1fbd5ef9ull);
}

TEST(Rendezvous, KeysSpreadEvenly) {
  auto targets = Targets(3);
  std::map<size_t, int> first;
  constexpr int kKeys = 30000;
  for (int k = 0; k < kKeys; ++k) ++first[RendezvousOrder("host-" + std::to_string(k), targets)[0]];
  ASSERT_EQ(first.size(), 3u);
  for (auto& [target, n] : first) {
    EXPECT_NEAR(n, kKeys / 3, kKeys / 3 * 0.05) << "target " << target;
  }
}

// Removing a target moves only the keys that preferred it, each to its
// second choice; every other key stays.
TEST(Rendezvous, RemovingATargetMovesOnlyItsKeys) {
  auto four = Targets(4);
  std::vector<std::string> three(four.begin(), four.begin() + 3);
  int moved = 0;
  constexpr int kKeys = 20000;
  for (int k = 0; k < kKeys; ++k) {
    std::string key = "host-" + std::to_string(k);
    auto order = RendezvousOrder(key, four);
    const std::string& before = four[order[0]];
    const std::string& after = three[RendezvousOrder(key, three)[0]];
    if (before == four[3]) {
      EXPECT_EQ(after, four[order[1]]) << key;
      ++moved;
    } else {
      EXPECT_EQ(after, before) << key;
    }
  }
  EXPECT_NEAR(moved, kKeys / 4, kKeys / 4 * 0.06);
}

}  // namespace
}  // namespace tlsprof::placement
