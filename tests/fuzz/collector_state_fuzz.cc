// The collector's state directory read back from arbitrary bytes on disk
// (collector/store/): StateStore::Open reads the framed snapshot
// (ReadSnapshot, StateFromProto through RestoreSnapshot) and replays every
// journal segment from the one it names (Journal::Open: frames, CRCs, the
// torn tail cut off; ReplayRecord: each record parsed and applied to the
// Ingestor).
//
// Promises checked (state_store.h: a restart replays exactly the state
// before it): when the directory opens, opening it again gives the same
// metrics (the torn tail is gone, nothing else changed); a compaction then
// succeeds, and opening the compacted directory gives the same metrics again.
//
// Input: u8 flags; u32 LE length N and N bytes of the `snapshot` file
// (N = 0xffffffff: no snapshot; N past the end: the rest is the snapshot);
// then journal segments, each u8 generation G, u32 LE length L and L bytes
// of `journal-<G>` (L past the end: the rest). With flags bit 0 the harness
// frames the files' contents anew before writing them (each intact
// journal frame gets its payload's CRC, the snapshot its length and CRC),
// so that mutations reach the parsers behind the CRC check; without it the
// bytes are written as they are. Written to a private directory (on
// /dev/shm) that is emptied for each input.
#include <prometheus/text_serializer.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "collector/expose/fleet_metrics.h"
#include "collector/ingest/ingestor.h"
#include "collector/ingest/test_report.h"
#include "collector/store/journal.h"
#include "collector/store/state_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tlsprof::collector::IngestOptions;
using tlsprof::collector::Ingestor;
using tlsprof::collector::StateStore;

constexpr int64_t kNowNs = tlsprof::collector::testing::kTestNowNs;

IngestOptions Options() {
  IngestOptions o;
  // Small caps, as collector_ingest_fuzz, so that small inputs reach them.
  o.max_series_per_agent = 8;
  o.max_services_per_agent = 4;
  o.max_hosts = 2;
  o.host_labels = true;
  return o;
}

std::string Metrics(const Ingestor& ingestor) {
  return prometheus::TextSerializer().Serialize(tlsprof::collector::FleetMetrics(ingestor, kNowNs));
}

uint32_t TakeU32(std::span<const uint8_t>& in) {
  const uint8_t* p = in.data();
  size_t n = in.size();
  const uint32_t v = tlsprof::fuzz::TakeU32(p, n);
  in = in.last(n);
  return v;
}

std::span<const uint8_t> Bytes(std::string_view s) {
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string_view View(std::span<const uint8_t> b) {
  return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
}

uint32_t GetU32(std::string_view p) {
  return uint32_t(uint8_t(p[0])) | uint32_t(uint8_t(p[1])) << 8 | uint32_t(uint8_t(p[2])) << 16 |
         uint32_t(uint8_t(p[3])) << 24;
}

// The journal's frames with their CRCs recomputed, up to the first that
// runs past the end (kept as it is: a torn tail stays torn).
std::string Reframe(std::string_view in) {
  std::string out;
  while (in.size() >= 8 && GetU32(in) <= in.size() - 8) {
    const uint32_t length = GetU32(in);
    out += tlsprof::collector::FrameRecord(in.substr(8, length));
    in.remove_prefix(8 + length);
  }
  out.append(in);
  return out;
}

void WriteFiles(const tlsprof::fuzz::ScratchDir& dir, std::span<const uint8_t> in) {
  if (in.empty()) return;
  const bool reframe = in[0] & 1;
  in = in.subspan(1);
  const uint32_t n = TakeU32(in);
  if (n != 0xffffffff) {
    const size_t len = std::min<size_t>(n, in.size());
    const std::string_view snapshot = View(in.first(len));
    // The snapshot is one frame over the whole file.
    const std::string framed =
        reframe && snapshot.size() >= 8 ? tlsprof::collector::FrameRecord(snapshot.substr(8)) : std::string(snapshot);
    dir.Write("snapshot", Bytes(framed));
    in = in.subspan(len);
  }
  while (!in.empty()) {
    const uint8_t generation = in[0];
    in = in.subspan(1);
    const uint32_t want = TakeU32(in);  // before in.size(): the order of a call's arguments is unspecified
    const size_t len = std::min<size_t>(want, in.size());
    const std::string_view journal = View(in.first(len));
    dir.Write("journal-" + std::to_string(generation), Bytes(reframe ? Reframe(journal) : std::string(journal)));
    in = in.subspan(len);
  }
}

void Differs(const char* what, const std::string& before, const std::string& after) {
  size_t at = 0;
  while (at < before.size() && at < after.size() && before[at] == after[at]) ++at;
  const size_t line = before.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t from = line == std::string::npos ? 0 : line + 1;
  std::fprintf(stderr, "%s: metrics differ at byte %zu:\n  before: %.200s\n  after:  %.200s\n", what, at,
               before.c_str() + std::min(from, before.size()), after.c_str() + std::min(from, after.size()));
  __builtin_trap();
}

// The calls into the code under test, on the state directory `dir`.
void Exercise(const std::string& dir) {
  std::string first;
  {
    Ingestor ingestor(Options());
    auto store = StateStore::Open(dir, 0, ingestor);
    if (!store.ok()) return;  // a clear error: the collector refuses to start
    first = Metrics(ingestor);
  }
  {
    Ingestor ingestor(Options());
    auto store = StateStore::Open(dir, 0, ingestor);
    if (!store.ok()) __builtin_trap();
    if (std::string again = Metrics(ingestor); again != first) Differs("reopened", first, again);
    if (!(*store)->Compact().ok()) __builtin_trap();
  }
  Ingestor ingestor(Options());
  auto store = StateStore::Open(dir, 0, ingestor);
  if (!store.ok()) __builtin_trap();
  if (std::string again = Metrics(ingestor); again != first) Differs("compacted", first, again);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  (void)tlsprof::fuzz::ScratchDir::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tlsprof::fuzz::ScratchDir& dir = tlsprof::fuzz::ScratchDir::Get();
  dir.Clear();
  WriteFiles(dir, std::span<const uint8_t>(data, size));
  Exercise(dir.path());
  return 0;
}
