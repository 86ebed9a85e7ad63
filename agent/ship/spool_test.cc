// The state directory and spool: durability, restart, quarantine, bound.
#include "agent/ship/spool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "agent/ship/shipper.h"
#include "agent/ship/test_collector.h"

namespace tlsprof::ship {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace testing;

void Spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

v1::AgentReport Numbered(uint64_t sequence) {
  v1::AgentReport r = MakeReport(WindowStart(static_cast<int64_t>(sequence)), 10, 1);
  r.set_sequence(sequence);
  r.set_agent_instance(std::string(16, 'x'));
  return r;
}

TEST(StateDirTest, CreatesInstanceOnceAndPersistsSequences) {
  TempDir dir;
  std::string root = dir.path() + "/a/b";  // parents are created too
  std::string instance;
  {
    auto state = StateDir::Open(root);
    ASSERT_TRUE(state.ok()) << state.error().message;
    instance = state->instance();
    EXPECT_EQ(instance.size(), 16u);
    EXPECT_EQ(state->next_sequence(), 1u);
    EXPECT_EQ(*state->Take(), 1u);
    EXPECT_EQ(*state->Take(), 2u);
    EXPECT_EQ(Slurp(root + "/next_sequence"), "3\n");
    EXPECT_EQ(Slurp(root + "/instance"), state->instance_hex() + "\n");
    EXPECT_EQ(state->instance_hex().size(), 32u);
  }
  auto again = StateDir::Open(root);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->instance(), instance);
  EXPECT_EQ(*again->Take(), 3u);
  // No tmp files are left behind.
  for (const std::string& name : Names(root)) EXPECT_FALSE(name.ends_with(".tmp")) << name;
}

TEST(StateDirTest, TwoInstancesGetDifferentIds) {
  TempDir a, b;
  auto sa = StateDir::Open(a.path());
  auto sb = StateDir::Open(b.path());
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_NE(sa->instance(), sb->instance());
}

TEST(StateDirTest, IsLockedWhileInUse) {
  TempDir dir;
  auto first = StateDir::Open(dir.path());
  ASSERT_TRUE(first.ok());
  auto second = StateDir::Open(dir.path());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("in use by another"), std::string::npos) << second.error().message;
  first = Error{"released"};
  EXPECT_TRUE(StateDir::Open(dir.path()).ok());
}

TEST(StateDirTest, UnreadableCounterStartsANewInstance) {
  TempDir dir;
  std::string instance;
  {
    auto state = StateDir::Open(dir.path());
    ASSERT_TRUE(state.ok());
    instance = state->instance();
    ASSERT_TRUE(state->Take().ok());
  }
  Spit(dir.path() + "/next_sequence", "garbage");
  auto state = StateDir::Open(dir.path());
  ASSERT_TRUE(state.ok());
  EXPECT_NE(state->instance(), instance);  // (new instance, 1) cannot collide with (old, 1)
  EXPECT_EQ(state->next_sequence(), 1u);
}

// Opens the spool in `dir` again (up to `max_quarantined` files kept aside)
// and checks how many files it quarantined.
void Reopen(const std::string& dir, uint32_t max_quarantined, uint64_t quarantined, std::optional<Spool>* out) {
  Spool::Loaded loaded;
  auto spool = Spool::Open(dir, max_quarantined, &loaded);
  ASSERT_TRUE(spool.ok()) << spool.error().message;
  EXPECT_EQ(loaded.quarantined, quarantined);
  out->emplace(std::move(*spool));
}

TEST(SpoolTest, BatchesSurviveReopenInSequenceOrder) {
  TempDir dir;
  {
    auto spool = Spool::Open(dir.path(), 8);
    ASSERT_TRUE(spool.ok());
    for (uint64_t seq : {3, 1, 2, 10}) ASSERT_TRUE(spool->Put(Numbered(seq)).ok());
    EXPECT_EQ(spool->batches(), 4u);
    spool->Remove(2);
  }
  Spit(dir.path() + "/.00000000000000000011.batch.tmp", "half a batch");  // a crash mid-write
  std::optional<Spool> spool;
  ASSERT_NO_FATAL_FAILURE(Reopen(dir.path(), 8, 0, &spool));
  EXPECT_EQ(spool->batches(), 3u);
  EXPECT_EQ(spool->Oldest(), 1u);
  EXPECT_EQ(spool->Oldest(1), 3u);
  EXPECT_EQ(spool->Newest(), 10u);
  auto report = spool->Load(10);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->sequence(), 10u);
  EXPECT_EQ(report->window().start_unix_ns(), Numbered(10).window().start_unix_ns());
  uint64_t total = 0;
  for (const std::string& name : Names(dir.path())) {
    EXPECT_FALSE(name.ends_with(".tmp")) << "stale tmp file kept: " << name;
    if (name.ends_with(".batch")) total += fs::file_size(dir.path() + "/" + name);
  }
  EXPECT_EQ(spool->bytes(), total);
  EXPECT_EQ(Names(dir.path()), (std::vector<std::string>{"00000000000000000001.batch", "00000000000000000003.batch",
                                                         "00000000000000000010.batch"}));
}

TEST(SpoolTest, CorruptFilesAreQuarantinedNotFatal) {
  TempDir dir;
  {
    auto spool = Spool::Open(dir.path(), 8);
    ASSERT_TRUE(spool.ok());
    for (uint64_t seq : {1, 2, 3, 4, 5}) ASSERT_TRUE(spool->Put(Numbered(seq)).ok());
  }
  std::string p1 = dir.path() + "/" + Spool::FileName(1), p2 = dir.path() + "/" + Spool::FileName(2);
  std::string p3 = dir.path() + "/" + Spool::FileName(3), p4 = dir.path() + "/" + Spool::FileName(4);
  std::string good = Slurp(p1);
  Spit(p1, good.substr(0, good.size() / 2));  // truncated
  std::string flipped = Slurp(p2);
  flipped.back() ^= 0x40;
  Spit(p2, flipped);                                                                               // bit flip: checksum
  Spit(p3, "");                                                                                    // empty
  fs::copy_file(dir.path() + "/" + Spool::FileName(5), p4, fs::copy_options::overwrite_existing);  // wrong name

  std::optional<Spool> spool;
  ASSERT_NO_FATAL_FAILURE(Reopen(dir.path(), 8, 4, &spool));
  EXPECT_EQ(spool->batches(), 1u);
  EXPECT_EQ(spool->Oldest(), 5u);
  EXPECT_EQ(Names(dir.path() + "/corrupt").size(), 4u);
  // A file that goes bad after start is quarantined by Load().
  Spit(dir.path() + "/" + Spool::FileName(5), "TLSPSPL1 but not really");
  auto report = spool->Load(5);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(spool->batches(), 0u);
  EXPECT_EQ(Names(dir.path() + "/corrupt").size(), 5u);
}

TEST(SpoolTest, QuarantineIsBounded) {
  TempDir dir;
  for (uint64_t seq = 1; seq <= 6; ++seq) Spit(dir.path() + "/" + Spool::FileName(seq), "junk");
  std::optional<Spool> spool;
  ASSERT_NO_FATAL_FAILURE(Reopen(dir.path(), 3, 6, &spool));
  std::vector<std::string> kept = Names(dir.path() + "/corrupt");
  ASSERT_EQ(kept.size(), 3u);
  for (const std::string& name : kept) EXPECT_GE(name, Spool::FileName(4)) << name;  // the newest kept
}

TEST(SpoolTest, DecodeRejectsWhatIsNotABatch) {
  EXPECT_TRUE(DecodeBatch(EncodeBatch(Numbered(7))).ok());
  EXPECT_FALSE(DecodeBatch("").ok());
  EXPECT_FALSE(DecodeBatch("garbage garbage garbage").ok());
  std::string batch = EncodeBatch(Numbered(7));
  EXPECT_FALSE(DecodeBatch(batch + "x").ok());
  EXPECT_FALSE(DecodeBatch(batch.substr(0, batch.size() - 1)).ok());
}

// Shipper-level restart behaviour that needs no collector.

ShipperOptions Offline(const std::string& state_dir) {
  ShipperOptions o;
  o.collectors = {"127.0.0.1:" + std::to_string(UnusedPort())};
  o.state_dir = state_dir;
  o.insecure = true;
  o.backoff_min = 10ms;
  o.backoff_max = 50ms;
  return o;
}

TEST(ShipperSpoolTest, SequenceIsNeverReusedAfterACrashBetweenSpoolAndCounter) {
  TempDir dir;
  {
    auto shipper = Shipper::Start(Offline(dir.path()));
    ASSERT_TRUE(shipper.ok());
    ASSERT_EQ(*(*shipper)->Seal(MakeReport(kT0, 10, 1)), 1u);
  }
  // As if a batch got spooled but its counter update was lost.
  auto state = StateDir::Open(dir.path());
  ASSERT_TRUE(state.ok());
  v1::AgentReport orphan = Numbered(9);
  orphan.set_agent_instance(state->instance());
  auto spool = Spool::Open(state->spool_dir(), 8);
  ASSERT_TRUE(spool.ok());
  ASSERT_TRUE(spool->Put(orphan).ok());
  state = Error{"closed"};
  auto shipper = Shipper::Start(Offline(dir.path()));
  ASSERT_TRUE(shipper.ok()) << shipper.error().message;
  EXPECT_EQ((*shipper)->stats().next_sequence, 10u);
  EXPECT_EQ(*(*shipper)->Seal(MakeReport(WindowStart(1), 10, 1)), 10u);
  EXPECT_EQ((*shipper)->stats().spooled_batches, 3u);
}

TEST(ShipperSpoolTest, BoundDropsOldestAndCounts) {
  TempDir dir;
  ShipperOptions options = Offline(dir.path());
  uint64_t one = EncodeBatch(Numbered(1)).size();
  options.spool_max_bytes = one * 3 + one / 2;  // room for three batches
  // After its first failed attempt the sender sleeps, so no batch is in
  // flight (the bound never drops the one in flight) while we seal.
  options.backoff_min = options.backoff_max = 30s;
  auto shipper = Shipper::Start(options);
  ASSERT_TRUE(shipper.ok());
  ASSERT_TRUE((*shipper)->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return (*shipper)->stats().send_errors == 1; }, 5s));
  for (int i = 1; i < 8; ++i) ASSERT_TRUE((*shipper)->Seal(MakeReport(WindowStart(i), 10, 1)).ok());
  ShipperStats s = (*shipper)->stats();
  EXPECT_EQ(s.sealed, 8u);
  EXPECT_EQ(s.spool_dropped, 5u);
  EXPECT_EQ(s.spooled_batches, 3u);
  EXPECT_LE(s.spooled_bytes, options.spool_max_bytes);
  shipper = Error{"stopped"};
  EXPECT_EQ(Names(dir.path() + "/spool"),
            (std::vector<std::string>{Spool::FileName(6), Spool::FileName(7), Spool::FileName(8)}));
  // The next report carries the count.
  options.spool_max_bytes = 64 << 20;
  auto again = Shipper::Start(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->stats().spooled_batches, 3u);
}

TEST(ShipperSpoolTest, CorruptSpoolFileIsQuarantinedAtStart) {
  TempDir dir;
  fs::create_directories(dir.path() + "/spool");
  Spit(dir.path() + "/spool/" + Spool::FileName(4), "not a batch");
  auto shipper = Shipper::Start(Offline(dir.path()));
  ASSERT_TRUE(shipper.ok()) << shipper.error().message;
  ShipperStats s = (*shipper)->stats();
  EXPECT_EQ(s.quarantined, 1u);
  EXPECT_EQ(s.spooled_batches, 0u);
  EXPECT_EQ(Names(dir.path() + "/spool/corrupt").size(), 1u);
}

}  // namespace
}  // namespace tlsprof::ship
