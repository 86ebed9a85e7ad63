// The agent's spool read back from arbitrary bytes on disk
// (agent/ship/spool.h): DecodeBatch on the bytes of a batch file, then
// Spool::Open on a spool directory holding them as two batch files (named by
// sequence 7, and by the sequence the batch holds) and a pin file, and
// Spool::Load of what it indexed.
//
// Promises checked: a batch that decodes encodes and decodes to the same
// report; Open indexes a file exactly when it decodes and holds the sequence
// of its name, and quarantines it otherwise; Load returns that report; a pin
// is kept only for an indexed batch, and is one non-empty line.
//
// Input: u8 flags, then u32 LE length N, N bytes of the batch file, then the
// pin file's bytes (N past the end: the whole rest is the batch, no pin).
// With flags bit 0 the harness writes the batch's payload length and CRC-32
// into its header (when it has one), so that mutations of the payload reach
// the report's parser behind the checksum; without it the bytes are used as
// they are. Written to a private directory (on /dev/shm) that is emptied for
// each input.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zlib.h>

#include "agent/ship/spool.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tlsprof::ship::Spool;

constexpr uint64_t kNamed = 7;

std::string_view View(std::span<const uint8_t> b) {
  return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
}

// The calls into the code under test: the batch's bytes, then the spool
// directory they were written to.
void Exercise(std::span<const uint8_t> batch, const std::string& spool_dir, bool with_pin) {
  using namespace tlsprof::ship;
  auto report = DecodeBatch(View(batch));
  if (report.ok()) {
    const std::string encoded = EncodeBatch(*report);
    auto again = DecodeBatch(encoded);
    if (!again.ok() || again->SerializeAsString() != report->SerializeAsString()) __builtin_trap();
  }

  Spool::Loaded loaded;
  auto spool = Spool::Open(spool_dir, 4, &loaded);
  if (!spool.ok()) __builtin_trap();  // the directory is there and readable
  const bool named_ok = report.ok() && report->sequence() == kNamed;
  if (spool->contains(kNamed) != named_ok) __builtin_trap();
  if (report.ok() && !spool->contains(report->sequence())) __builtin_trap();
  const uint64_t expect_quarantined = report.ok() ? (named_ok ? 0 : 1) : 1;
  if (loaded.quarantined != expect_quarantined) __builtin_trap();
  for (const auto& [sequence, target] : spool->pins()) {
    if (!with_pin || !spool->contains(sequence) || target.empty() || target.find('\n') != std::string::npos) {
      __builtin_trap();
    }
  }
  if (report.ok()) {
    auto loaded_report = spool->Load(report->sequence());
    if (!loaded_report.ok() || loaded_report->SerializeAsString() != report->SerializeAsString()) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  (void)tlsprof::fuzz::ScratchDir::Get();
  return 0;
}

// spool.cc's header: magic (8 bytes), payload length (u64 LE), CRC-32 of
// the payload (u32 LE), as a batch the agent wrote itself carries them.
void SealHeader(std::vector<uint8_t>& batch) {
  constexpr size_t kHeader = 20;
  if (batch.size() < kHeader) return;
  const uint64_t length = batch.size() - kHeader;
  const uint32_t crc =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), batch.data() + kHeader, static_cast<uInt>(length)));
  for (int i = 0; i < 8; ++i) batch[8 + i] = static_cast<uint8_t>(length >> (8 * i));
  for (int i = 0; i < 4; ++i) batch[16 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const tlsprof::fuzz::ScratchDir& dir = tlsprof::fuzz::ScratchDir::Get();
  dir.Clear();
  const bool seal = data[0] & 1;
  std::span<const uint8_t> input(data + 1, size - 1), split, pin;
  const bool with_pin = tlsprof::fuzz::SplitTwo(input, split, pin);
  std::vector<uint8_t> sealed(with_pin ? split.begin() : input.begin(), with_pin ? split.end() : input.end());
  if (seal) SealHeader(sealed);
  const std::span<const uint8_t> batch(sealed);
  dir.Write("spool/" + Spool::FileName(kNamed), batch);
  // The same bytes under the name of the sequence they hold, when they
  // decode: the file Open keeps.
  if (auto report = tlsprof::ship::DecodeBatch(View(batch)); report.ok() && report->sequence() != kNamed) {
    dir.Write("spool/" + Spool::FileName(report->sequence()), batch);
  }
  if (with_pin) dir.Write("spool/" + Spool::PinFileName(kNamed), pin);
  Exercise(batch, dir.path() + "/spool", with_pin);
  return 0;
}
