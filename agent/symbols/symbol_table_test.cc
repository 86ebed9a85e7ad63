#include "agent/symbols/symbol_table.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>
#include <tuple>

namespace tlsprof::symbols {
namespace {

// Name of the symbol Find() attributes `addr` to, or "" when none.
std::string At(const SymbolTable& t, uint64_t addr) {
  auto i = t.Find(addr);
  return i ? t.at(*i).name : "";
}

TEST(SymbolTableTest, EmptyTableFindsNothing) {
  SymbolTable t;
  t.Finalize();
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(t.Find(0));
  EXPECT_FALSE(t.Find(12345));
}

TEST(SymbolTableTest, RespectsSizesAndGaps) {
  SymbolTable t;
  t.Add(0x120, 0x10, "b");  // added out of order on purpose
  t.Add(0x100, 0x10, "a");
  t.Finalize();
  EXPECT_EQ(At(t, 0xff), "");
  EXPECT_EQ(At(t, 0x100), "a");
  EXPECT_EQ(At(t, 0x10f), "a");
  EXPECT_EQ(At(t, 0x110), "");  // gap: not attributed to the neighbour
  EXPECT_EQ(At(t, 0x11f), "");
  EXPECT_EQ(At(t, 0x120), "b");
  EXPECT_EQ(At(t, 0x12f), "b");
  EXPECT_EQ(At(t, 0x130), "");
  EXPECT_EQ(At(t, std::numeric_limits<uint64_t>::max()), "");
}

TEST(SymbolTableTest, SizeZeroNeverMatches) {
  SymbolTable t;
  t.Add(0x200, 0, "label");
  t.Add(0x100, 0x10, "f");
  t.Finalize();
  EXPECT_EQ(t.size(), 2u);  // kept for listing, but never matched
  EXPECT_EQ(At(t, 0x200), "");
  EXPECT_EQ(At(t, 0x201), "");
  EXPECT_EQ(At(t, 0x100), "f");
}

TEST(SymbolTableTest, DropsExactDuplicatesKeepingLargestSize) {
  SymbolTable t;
  t.Add(0x100, 0x10, "f");
  t.Add(0x100, 0x20, "f");  // e.g. the same name from .symtab and .dynsym
  t.Add(0x100, 0x20, "f");
  t.Finalize();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.at(0).size, 0x20u);
  EXPECT_EQ(At(t, 0x11f), "f");
}

TEST(SymbolTableTest, AliasesAtOneAddressResolveDeterministically) {
  SymbolTable t1, t2;
  t1.Add(0x100, 0x10, "EVP_alias_b");
  t1.Add(0x100, 0x10, "EVP_alias_a");
  t2.Add(0x100, 0x10, "EVP_alias_a");
  t2.Add(0x100, 0x10, "EVP_alias_b");
  t1.Finalize();
  t2.Finalize();
  EXPECT_EQ(t1.size(), 2u);
  EXPECT_EQ(At(t1, 0x105), "EVP_alias_a");  // alphabetically first, whatever the order
  EXPECT_EQ(At(t2, 0x105), "EVP_alias_a");
}

TEST(SymbolTableTest, SameStartSmallerSymbolWinsWhereItApplies) {
  SymbolTable t;
  t.Add(0x0, 100, "big");
  t.Add(0x0, 10, "small");
  t.Finalize();
  EXPECT_EQ(At(t, 5), "small");
  EXPECT_EQ(At(t, 10), "big");
  EXPECT_EQ(At(t, 99), "big");
  EXPECT_EQ(At(t, 100), "");
}

TEST(SymbolTableTest, NestedOverlapsPickHighestContainingStart) {
  SymbolTable t;
  t.Add(0, 100, "A");  // [0, 100)
  t.Add(10, 10, "B");  // [10, 20)
  t.Add(15, 35, "C");  // [15, 50)
  t.Add(60, 5, "D");   // [60, 65)
  t.Finalize();
  EXPECT_EQ(At(t, 5), "A");
  EXPECT_EQ(At(t, 12), "B");
  EXPECT_EQ(At(t, 17), "C");  // B still contains 17, but C starts later
  EXPECT_EQ(At(t, 30), "C");
  EXPECT_EQ(At(t, 55), "A");  // back to the enclosing symbol
  EXPECT_EQ(At(t, 62), "D");
  EXPECT_EQ(At(t, 65), "A");
  EXPECT_EQ(At(t, 100), "");
}

TEST(SymbolTableTest, HugeSizeIsClampedNotWrapped) {
  SymbolTable t;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  t.Add(max - 10, 100, "top");
  t.Add(0x10, 0x10, "low");
  t.Finalize();
  EXPECT_EQ(At(t, max - 5), "top");
  EXPECT_EQ(At(t, 5), "");  // a wrapped end would have covered this
  EXPECT_EQ(At(t, 0x15), "low");
}

// A symbol spanning everything does not make lookups in it slow or wrong:
// every small symbol inside wins over it, and gaps fall back to it.
TEST(SymbolTableTest, SpanningSymbolWithManyInnerSymbols) {
  SymbolTable t;
  t.Add(0, 1'000'000, "span");
  for (uint64_t a = 1000; a < 900'000; a += 100) t.Add(a, 50, "f" + std::to_string(a));
  t.Finalize();
  EXPECT_EQ(At(t, 1010), "f1000");
  EXPECT_EQ(At(t, 1060), "span");
  EXPECT_EQ(At(t, 899'920), "f899900");
  EXPECT_EQ(At(t, 950'000), "span");
}

// Compares Find() with a direct reading of the contract on random tables:
// among the symbols containing the address, the highest start wins, then the
// smaller size, then the alphabetically first name.
TEST(SymbolTableTest, MatchesReferenceOnRandomTables) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 50; ++round) {
    SymbolTable t;
    std::vector<Symbol> ref;
    int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      Symbol s{rng() % 500, rng() % 4 == 0 ? 0 : rng() % 80, "s" + std::to_string(rng() % 40)};
      t.Add(s.addr, s.size, s.name);
      ref.push_back(s);
    }
    t.Finalize();
    // Exact duplicates (same address and name) collapse to the largest size.
    std::map<std::pair<uint64_t, std::string>, uint64_t> unique;
    for (const Symbol& s : ref) {
      uint64_t& size = unique[{s.addr, s.name}];
      size = std::max(size, s.size);
    }
    ref.clear();
    for (const auto& [key, size] : unique) ref.push_back(Symbol{key.first, size, key.second});
    for (uint64_t a = 0; a < 600; ++a) {
      const Symbol* best = nullptr;
      for (const Symbol& s : ref) {
        if (a < s.addr || a - s.addr >= s.size) continue;
        if (best == nullptr || std::tie(s.addr, best->size, best->name) > std::tie(best->addr, s.size, s.name)) {
          best = &s;
        }
      }
      ASSERT_EQ(At(t, a), best ? best->name : "") << "round " << round << " addr " << a;
    }
  }
}

}  // namespace
}  // namespace tlsprof::symbols
