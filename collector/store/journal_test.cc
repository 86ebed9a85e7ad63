#include "collector/store/journal.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

#include "collector/expose/fleet_metrics.h"
#include "collector/ingest/test_report.h"
#include "collector/store/snapshot.h"
#include "collector/store/state_store.h"

namespace tlsprof::collector {
namespace {

using testing::kTestNowNs;
using testing::MakeReport;
using testing::WithUsage;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tlsprof-collector-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> ReadBack(const std::string& path) {
  std::vector<std::string> records;
  Result<std::unique_ptr<Journal>> j = Journal::Open(path, [&](std::string_view r) {
    records.emplace_back(r);
    return OkStatus();
  });
  EXPECT_TRUE(j.ok()) << (j.ok() ? "" : j.error().message);
  return records;
}

TEST(Journal, RecordsComeBackInOrder) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  {
    auto j = Journal::Open(path, [](std::string_view) { return OkStatus(); });
    ASSERT_TRUE(j.ok());
    uint64_t last = 0;
    for (int i = 0; i < 100; ++i) last = (*j)->Enqueue("record-" + std::to_string(i));
    ASSERT_TRUE((*j)->WaitDurable(last).ok());
    EXPECT_EQ((*j)->bytes(), std::filesystem::file_size(path));
  }
  std::vector<std::string> records = ReadBack(path);
  ASSERT_EQ(records.size(), 100u);
  EXPECT_EQ(records[0], "record-0");
  EXPECT_EQ(records[99], "record-99");
}

TEST(Journal, GroupCommitFromManyThreads) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  auto j = Journal::Open(path, [](std::string_view) { return OkStatus(); });
  ASSERT_TRUE(j.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        uint64_t ticket = (*j)->Enqueue(std::to_string(t) + ":" + std::to_string(i));
        EXPECT_TRUE((*j)->WaitDurable(ticket).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  j->reset();
  EXPECT_EQ(ReadBack(path).size(), 400u);
}

// A crash mid-write leaves a torn frame at the end: every cut point of the
// last record, and a flipped byte in it, must give back exactly the earlier
// records, and appending afterwards must continue cleanly.
TEST(Journal, TornTailIsIgnoredAndCutOff) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  std::string whole;
  whole += FrameRecord("first");
  whole += FrameRecord("second");
  const std::string last = FrameRecord("the third record");
  for (size_t cut = 1; cut <= last.size(); ++cut) {
    for (bool flip : {false, true}) {
      if (flip && cut != last.size()) continue;
      std::string data = whole + last.substr(0, cut);
      if (flip) data[data.size() - 3] ^= 0x40;
      { std::ofstream(path, std::ios::binary | std::ios::trunc) << data; }
      std::vector<std::string> got;
      {
        auto j = Journal::Open(path, [&](std::string_view r) {
          got.emplace_back(r);
          return OkStatus();
        });
        ASSERT_TRUE(j.ok());
        if (cut == last.size() && !flip) {
          EXPECT_EQ(got.size(), 3u);
          continue;
        }
        EXPECT_EQ(got, (std::vector<std::string>{"first", "second"})) << "cut " << cut << " flip " << flip;
        EXPECT_EQ(std::filesystem::file_size(path), whole.size());
        ASSERT_TRUE((*j)->WaitDurable((*j)->Enqueue("after")).ok());
      }
      EXPECT_EQ(ReadBack(path), (std::vector<std::string>{"first", "second", "after"}));
    }
  }
}

TEST(Journal, HugeLengthIsTorn) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  std::string data = FrameRecord("ok") + std::string("\xff\xff\xff\x7f\0\0\0\0", 8);
  { std::ofstream(path, std::ios::binary) << data; }
  EXPECT_EQ(ReadBack(path), std::vector<std::string>{"ok"});
}

// Eight zero bytes would frame an empty payload with CRC 0: not a record.
TEST(Journal, AZeroRecordIsNotARecord) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  const std::string zeros(8, '\0');
  { std::ofstream(path, std::ios::binary) << FrameRecord("a") + zeros; }
  EXPECT_EQ(ReadBack(path), std::vector<std::string>{"a"});
  EXPECT_EQ(std::filesystem::file_size(path), FrameRecord("a").size());  // a zeroed tail is cut
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << FrameRecord("a") + zeros + FrameRecord("b"); }
  auto j = Journal::Open(path, [](std::string_view) { return OkStatus(); });
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)->records_replayed(), 2u);
  EXPECT_EQ((*j)->corrupt_bytes_skipped(), 8u);
}

// Damage in place (not a crash's torn tail): a byte flipped anywhere in
// record 2 of 10 loses record 2 only, and appending goes on after record 10.
TEST(Journal, ADamagedRecordLosesOnlyItself) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  std::vector<std::string> frames, all;
  for (int i = 1; i <= 10; ++i) {
    all.push_back("record-" + std::to_string(i) + std::string(static_cast<size_t>(i * 7), 'x'));
    frames.push_back(FrameRecord(all.back()));
  }
  std::vector<std::string> kept = all;
  kept.erase(kept.begin() + 1);
  const size_t at = frames[0].size();
  for (size_t flip = 0; flip < frames[1].size(); ++flip) {
    std::string data;
    for (const auto& f : frames) data += f;
    data[at + flip] = static_cast<char>(data[at + flip] ^ 0x10);
    { std::ofstream(path, std::ios::binary | std::ios::trunc) << data; }
    std::vector<std::string> got;
    {
      auto j = Journal::Open(path, [&](std::string_view r) {
        got.emplace_back(r);
        return OkStatus();
      });
      ASSERT_TRUE(j.ok()) << j.error().message;
      EXPECT_EQ(got, kept) << "byte " << flip << " of record 2 flipped";
      EXPECT_EQ((*j)->corrupt_bytes_skipped(), frames[1].size());
      ASSERT_TRUE((*j)->WaitDurable((*j)->Enqueue("after")).ok());
    }
    kept.push_back("after");
    EXPECT_EQ(ReadBack(path), kept);
    kept.pop_back();
  }
}

// Bad bytes whose every offset looks like a long frame: the search for the
// next record stops at its budget, and Open() names where the damage is.
TEST(Journal, AnUnresyncableFileIsAnErrorNamingTheOffset) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  std::string data = FrameRecord("intact");
  const size_t bad = data.size();
  // Every offset reads a length of 2 MiB or so that fits, and a wrong CRC.
  std::string noise(4u << 20, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = (i % 4 == 2) ? '\x20' : static_cast<char>(i % 4 == 0 ? 1 : 0);
  data += noise;
  { std::ofstream(path, std::ios::binary) << data; }
  auto j = Journal::Open(path, [](std::string_view) { return OkStatus(); });
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.error().message.find("at byte " + std::to_string(bad)), std::string::npos) << j.error().message;
  EXPECT_EQ(std::filesystem::file_size(path), data.size());  // nothing cut
}

// A write that fails (here EFBIG, from RLIMIT_FSIZE; ENOSPC takes the same
// path) cuts the file back, keeps the records queued, fails fast until
// kRetryAfter, and once the file can grow again writes them all, in order.
TEST(Journal, AFailedWriteIsRetriedOnceTheDiskTakesItAgain) {
  TempDir dir;
  const std::string path = dir.path() + "/j";
  auto j = Journal::Open(path, [](std::string_view) { return OkStatus(); });
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->WaitDurable((*j)->Enqueue("first")).ok());
  const auto durable = std::filesystem::file_size(path);
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old), 0);
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = durable + 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const uint64_t big = (*j)->Enqueue(std::string(16384, 'b'));
  Status failed = (*j)->WaitDurable(big);
  EXPECT_FALSE(failed.ok());
  EXPECT_FALSE((*j)->healthy());
  EXPECT_EQ(std::filesystem::file_size(path), durable);  // the partial write is cut off
  // Within kRetryAfter: fails at once, without writing.
  const uint64_t next = (*j)->Enqueue("next");
  EXPECT_FALSE((*j)->WaitDurable(next).ok());
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  ASSERT_EQ(sigaction(SIGXFSZ, &old, nullptr), 0);
  std::this_thread::sleep_for(Journal::kRetryAfter + std::chrono::milliseconds(50));
  EXPECT_TRUE((*j)->healthy());
  ASSERT_TRUE((*j)->WaitDurable(next).ok());
  j->reset();
  EXPECT_EQ(ReadBack(path), (std::vector<std::string>{"first", std::string(16384, 'b'), "next"}));
}

struct Submitted {
  std::string key;
  v1::AgentReport report;
};

// Applies a report through the Ingestor and the store the way Submit does.
ApplyResult Submit(Ingestor& ingestor, StateStore& store, const std::string& key, const v1::AgentReport& report) {
  state::JournalRecord record;
  record.set_agent_key(key);
  record.set_received_unix_ns(kTestNowNs);
  if (report.sequence() % 2) {
    // As the collector journals now: the request bytes as received.
    v1::SubmitRequest request;
    *request.mutable_report() = report;
    record.set_submit_request(request.SerializeAsString());
  } else {
    *record.mutable_report() = report;  // as older collectors did
  }
  uint64_t ticket = 0;
  ApplyResult r = ingestor.Apply(key, report, kTestNowNs, [&] { ticket = store.Enqueue(record.SerializeAsString()); });
  if (!r.duplicate) {
    EXPECT_TRUE(store.WaitDurable(ticket).ok());
  }
  store.MaybeCompact();
  return r;
}

std::string Metrics(const Ingestor& ingestor) {
  std::string out;
  for (const auto& f : FleetMetrics(ingestor)) {
    for (const auto& m : f.metric) {
      out += f.name;
      for (const auto& l : m.label) out += "," + l.name + "=" + l.value;
      out += " " + std::to_string(m.counter.value) + "\n";
    }
  }
  return out;
}

TEST(StateStore, ReopenGivesTheSameCountersAndDuplicates) {
  for (uint64_t compact_bytes : {uint64_t{0}, uint64_t{300}}) {
    TempDir dir;
    std::string before;
    {
      Ingestor ingestor(IngestOptions{});
      auto store = StateStore::Open(dir.path(), compact_bytes, ingestor);
      ASSERT_TRUE(store.ok());
      for (uint64_t s = 1; s <= 20; ++s) {
        if (s == 7) continue;  // a gap: 7 must stay acceptable after the restart
        EXPECT_FALSE(Submit(ingestor, **store, "a", MakeReport(s)).duplicate);
      }
      EXPECT_FALSE(Submit(ingestor, **store, "b", MakeReport(1)).duplicate);
      before = Metrics(ingestor);
      if (compact_bytes) {
        (*store)->WaitForCompaction();
        EXPECT_GT((*store)->generation(), 0u);
      }
    }
    Ingestor ingestor(IngestOptions{});
    auto store = StateStore::Open(dir.path(), compact_bytes, ingestor);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ(Metrics(ingestor), before);
    EXPECT_TRUE(Submit(ingestor, **store, "a", MakeReport(20)).duplicate);
    EXPECT_TRUE(Submit(ingestor, **store, "a", MakeReport(3)).duplicate);
    EXPECT_TRUE(Submit(ingestor, **store, "b", MakeReport(1)).duplicate);
    EXPECT_FALSE(Submit(ingestor, **store, "a", MakeReport(7)).duplicate);
    // Exactly one journal file (the one the snapshot names) is left once a
    // compaction in the background is done.
    (*store)->WaitForCompaction();
    int journals = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      journals += e.path().filename().string().rfind("journal-", 0) == 0;
    }
    EXPECT_EQ(journals, 1);
  }
}

TEST(StateStore, OneCollectorPerDirectory) {
  TempDir dir;
  Ingestor a(IngestOptions{}), b(IngestOptions{});
  auto first = StateStore::Open(dir.path(), 0, a);
  ASSERT_TRUE(first.ok());
  auto second = StateStore::Open(dir.path(), 0, b);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("another collector"), std::string::npos);
}

TEST(StateStore, CorruptSnapshotIsAnError) {
  TempDir dir;
  {
    Ingestor ingestor(IngestOptions{});
    auto store = StateStore::Open(dir.path(), 0, ingestor);
    ASSERT_TRUE(store.ok());
    Submit(ingestor, **store, "a", MakeReport(1));
    ASSERT_TRUE((*store)->Compact().ok());
  }
  const std::string snapshot = dir.path() + "/snapshot";
  std::string data;
  {
    std::ifstream in(snapshot, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  data[data.size() / 2] ^= 1;
  { std::ofstream(snapshot, std::ios::binary | std::ios::trunc) << data; }
  Ingestor ingestor(IngestOptions{});
  auto store = StateStore::Open(dir.path(), 0, ingestor);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.error().message.find("corrupt snapshot"), std::string::npos) << store.error().message;
}

// A record whose CRC holds but whose report Submit would have refused (a
// TlsCpu.bucket past the enum: the ingestor indexes its per-minute bucket
// seconds by it) is an error at start, never applied.
TEST(StateStore, JournalRecordWithAnInvalidReportIsAnError) {
  TempDir dir;
  {
    Ingestor ingestor(IngestOptions{});
    auto store = StateStore::Open(dir.path(), 0, ingestor);
    ASSERT_TRUE(store.ok()) << store.error().message;
    v1::SubmitRequest request;
    *request.mutable_report() = MakeReport(1);
    request.mutable_report()->mutable_services(0)->mutable_tls(0)->set_bucket(static_cast<v1::Bucket>(10));
    state::JournalRecord record;
    record.set_agent_key("a");
    record.set_received_unix_ns(kTestNowNs);
    record.set_submit_request(request.SerializeAsString());
    ASSERT_TRUE((*store)->WaitDurable((*store)->Enqueue(record.SerializeAsString())).ok());
  }
  Ingestor ingestor(IngestOptions{});
  auto store = StateStore::Open(dir.path(), 0, ingestor);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.error().message.find("bucket"), std::string::npos) << store.error().message;
}

}  // namespace
}  // namespace tlsprof::collector

namespace tlsprof::collector {
namespace {

TEST(Journal, FailedJournalRefusesDurability) {
  TempDir dir;
  auto j = Journal::Open(dir.path() + "/j", [](std::string_view) { return OkStatus(); });
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->WaitDurable((*j)->Enqueue("before")).ok());
  EXPECT_TRUE((*j)->healthy());
  (*j)->Fail("rotation failed");
  EXPECT_FALSE((*j)->healthy());
  Status s = (*j)->WaitDurable((*j)->Enqueue("after"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("rotation failed"), std::string::npos);
}

}  // namespace
}  // namespace tlsprof::collector

namespace tlsprof::collector {
namespace {

// A certificate CN is not necessarily UTF-8; the journal must still replay it.
TEST(StateStore, NonUtf8IdentitySurvivesReplayAndSnapshot) {
  TempDir dir;
  const std::string key = MakeAgentKey("\xff\xfe latin-1 \xe9", "host-1");
  for (bool compact : {false, true}) {
    {
      Ingestor ingestor(IngestOptions{});
      auto store = StateStore::Open(dir.path(), 0, ingestor);
      ASSERT_TRUE(store.ok()) << store.error().message;
      Submit(ingestor, **store, key, MakeReport(compact ? 2 : 1));
      if (compact) {
        ASSERT_TRUE((*store)->Compact().ok());
      }
    }
    Ingestor ingestor(IngestOptions{});
    auto store = StateStore::Open(dir.path(), 0, ingestor);
    ASSERT_TRUE(store.ok()) << store.error().message;
    EXPECT_TRUE(Submit(ingestor, **store, key, MakeReport(1)).duplicate);
  }
}

}  // namespace
}  // namespace tlsprof::collector

namespace tlsprof::collector {
namespace {

// What a kill -9 leaves: the directory's files as they are at that moment.
void CopyDirectory(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const auto& e : std::filesystem::directory_iterator(from)) {
    if (e.path().filename() == "lock") continue;
    std::filesystem::copy_file(e.path(), to + "/" + e.path().filename().string(),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

std::string Reopened(const std::string& dir, uint64_t* journals = nullptr) {
  Ingestor ingestor(IngestOptions{});
  auto store = StateStore::Open(dir, 0, ingestor);
  EXPECT_TRUE(store.ok()) << store.error().message;
  if (!store.ok()) return "";
  // Duplicates are remembered across the crash too.
  EXPECT_TRUE(Submit(ingestor, **store, "a", MakeReport(1)).duplicate);
  if (journals) {
    *journals = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      *journals += e.path().filename().string().rfind("journal-", 0) == 0;
    }
  }
  return Metrics(ingestor);
}

// A crash while the compaction runs in the background (after the journal went
// on in a new segment, before the snapshot naming it is written), and after.
TEST(StateStore, CrashDuringBackgroundCompactionReplaysEverything) {
  TempDir dir, crash1, crash2, crash3;
  Ingestor ingestor(IngestOptions{});
  auto store = StateStore::Open(dir.path(), 0, ingestor);
  ASSERT_TRUE(store.ok());
  for (uint64_t s = 1; s <= 5; ++s) Submit(ingestor, **store, "a", MakeReport(s));
  ASSERT_TRUE((*store)->Compact().ok());  // an older snapshot exists
  for (uint64_t s = 6; s <= 10; ++s) Submit(ingestor, **store, "a", MakeReport(s));

  auto snapshot = (*store)->BeginCompaction();
  ASSERT_TRUE(snapshot.ok());
  // Accepted while the snapshot is being written: they go to the new segment.
  for (uint64_t s = 11; s <= 15; ++s) Submit(ingestor, **store, "b", MakeReport(s));
  CopyDirectory(dir.path(), crash1.path());
  const std::string expected = Metrics(ingestor);
  EXPECT_NE(expected.find("tlsprof_reports_total 15.000000"), std::string::npos) << expected;

  ASSERT_TRUE((*store)->FinishCompaction(**snapshot).ok());
  CopyDirectory(dir.path(), crash2.path());
  Submit(ingestor, **store, "b", MakeReport(16));
  CopyDirectory(dir.path(), crash3.path());
  const std::string expected3 = Metrics(ingestor);

  uint64_t journals = 0;
  EXPECT_EQ(Reopened(crash1.path(), &journals), expected);
  EXPECT_EQ(journals, 2u);  // the segment the old snapshot names, and the new one
  EXPECT_EQ(Reopened(crash2.path(), &journals), expected);
  EXPECT_EQ(journals, 1u);
  EXPECT_EQ(Reopened(crash3.path()), expected3);
}

}  // namespace
}  // namespace tlsprof::collector

namespace tlsprof::collector {
namespace {

// Every field state.proto keeps, compared with repeated fields as sets (the
// agents' and minutes' hash maps iterate in any order).
::testing::AssertionResult SameState(const state::State& a, const state::State& b) {
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_repeated_field_comparison(google::protobuf::util::MessageDifferencer::AS_SET);
  std::string diff;
  differencer.ReportDifferencesToString(&diff);
  if (differencer.Compare(a, b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << diff;
}

state::State StateOf(const Ingestor& ingestor) {
  state::State s;
  TakeSnapshot(ingestor, s);
  return s;
}

state::State SnapshotFile(const std::string& dir) {
  std::ifstream in(dir + "/snapshot", std::ios::binary);
  std::stringstream data;
  data << in.rdbuf();
  state::State s;
  EXPECT_GT(data.str().size(), 8u);
  EXPECT_TRUE(data.str().size() > 8 && s.ParseFromString(data.str().substr(8)));  // after the length and CRC
  return s;
}

// A snapshot that names one agent twice (collector_state_fuzz's finding: its
// connection series were counted once per record, so the series gauge read
// one more before a compaction than after) is an error, not merged.
TEST(StateStore, SnapshotWithAnAgentTwiceIsAnError) {
  Ingestor ingestor(IngestOptions{});
  v1::AgentReport report = MakeReport(1);
  ingestor.Apply("a", WithUsage(report), kTestNowNs);
  state::State snapshot = StateOf(ingestor);
  ASSERT_EQ(snapshot.agents_size(), 1);
  ASSERT_GT(snapshot.agents(0).connections_size(), 0);
  ASSERT_TRUE(StateFromProto(snapshot).ok());
  *snapshot.add_agents() = snapshot.agents(0);
  auto restored = StateFromProto(snapshot);
  ASSERT_FALSE(restored.ok());
  EXPECT_NE(restored.error().message.find("agent a appears twice"), std::string::npos) << restored.error().message;
}

// An agent's connection series in a snapshot without its duty cycle
// (collector_state_fuzz's finding: they were restored and counted, but not
// written back, so a compaction lost them) survive a compaction.
TEST(StateStore, ConnectionsWithoutADutyCycleSurviveACompaction) {
  Ingestor ingestor(IngestOptions{});
  v1::AgentReport report = MakeReport(1);
  ingestor.Apply("a", WithUsage(report), kTestNowNs);
  state::State snapshot = StateOf(ingestor);
  ASSERT_GT(snapshot.agents(0).connections_size(), 0);
  snapshot.mutable_agents(0)->clear_duty_cycle();
  auto restored = StateFromProto(snapshot);
  ASSERT_TRUE(restored.ok()) << restored.error().message;
  state::State again;
  StateToProto(*restored, again);
  EXPECT_EQ(again.agents(0).connections_size(), snapshot.agents(0).connections_size());
  EXPECT_EQ(restored->Series(), StateFromProto(again)->Series());
}

// What makes Copy cheap under the ingest lock: the copy shares each agent
// with the live state until a report writes it, and that write goes to a
// clone (the copy keeps what it had).
TEST(StateStore, CopySharesAgentsUntilOneIsWritten) {
  Ingestor ingestor(IngestOptions{});
  ingestor.Apply("a", MakeReport(1), kTestNowNs);
  ingestor.Apply("b", MakeReport(1), kTestNowNs);
  const FleetState copy = ingestor.Copy();
  auto live = [&](const std::string& key) {
    return ingestor.Read([&](const FleetState& s) { return &*s.agents.at(key); });
  };
  EXPECT_EQ(live("a"), &*copy.agents.at("a"));
  EXPECT_EQ(live("b"), &*copy.agents.at("b"));
  ingestor.Apply("a", MakeReport(2), kTestNowNs);
  EXPECT_NE(live("a"), &*copy.agents.at("a"));
  EXPECT_EQ(live("b"), &*copy.agents.at("b"));
  EXPECT_EQ(copy.agents.at("a")->reports, 1u);
  EXPECT_EQ(ingestor.Read([](const FleetState& s) { return s.agents.at("a")->reports; }), 2u);
  EXPECT_EQ(copy.minutes.begin()->second->reports, 2u);
  EXPECT_EQ(ingestor.Read([](const FleetState& s) { return s.minutes.begin()->second->reports; }), 3u);
}

// The snapshot is built, serialized and written with no lock that ingest
// takes: while it is (the hook), another thread submits reports for the same
// agents and each is applied and made durable. The snapshot still holds
// exactly the state at the journal switch (the agents written meanwhile were
// cloned, not changed under it), and snapshot + journal restore the live
// state exactly.
TEST(StateStore, IngestGoesOnWhileTheSnapshotIsWritten) {
  constexpr int kAgents = 40;
  TempDir dir;
  state::State at_switch, live;
  {
    Ingestor ingestor(IngestOptions{});
    auto store = StateStore::Open(dir.path(), 0, ingestor);
    ASSERT_TRUE(store.ok()) << store.error().message;
    auto submit = [&](uint64_t first, uint64_t last) {
      for (int a = 0; a < kAgents; ++a) {
        for (uint64_t s = first; s <= last; ++s) {
          v1::AgentReport report = MakeReport(s);
          if (a % 2) WithUsage(report);  // connections: the agents' maps too
          EXPECT_FALSE(Submit(ingestor, **store, "agent-" + std::to_string(a), report).duplicate);
        }
      }
    };
    submit(1, 3);
    at_switch = StateOf(ingestor);
    ASSERT_EQ(at_switch.reports(), 3u * kAgents);

    std::thread ingest;
    bool finished_meanwhile = false;
    (*store)->SetBeforeSnapshotForTest([&] {
      std::promise<void> done;
      std::future<void> finished = done.get_future();
      ingest = std::thread([&, done = std::move(done)]() mutable {
        submit(4, 6);
        done.set_value();
      });
      // Were a lock of the ingest path held here, this would time out.
      finished_meanwhile = finished.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    });
    ASSERT_TRUE((*store)->Compact().ok());
    ingest.join();
    EXPECT_TRUE(finished_meanwhile) << "ingest did not complete while the snapshot was being written";

    state::State written = SnapshotFile(dir.path());
    EXPECT_EQ(written.journal_generation(), 1u);
    written.clear_journal_generation();
    EXPECT_TRUE(SameState(written, at_switch));
    live = StateOf(ingestor);
    EXPECT_EQ(live.reports(), 6u * kAgents);
  }
  // The reports of the hook are in journal-1 only: replayed once, after the
  // snapshot, to the same state (the sequence windows, the usage gauges, the
  // summary minute and every counter).
  Ingestor ingestor(IngestOptions{});
  auto store = StateStore::Open(dir.path(), 0, ingestor);
  ASSERT_TRUE(store.ok()) << store.error().message;
  EXPECT_TRUE(SameState(StateOf(ingestor), live));
  EXPECT_TRUE(Submit(ingestor, **store, "agent-0", MakeReport(6)).duplicate);
}

}  // namespace
}  // namespace tlsprof::collector
