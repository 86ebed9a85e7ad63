// The decoders of accessor machine code the usage plans read off a library
// (agent/usage/accessors.h, accessor_paths.h) and the Go code helpers
// (go_plan.h), on raw x86-64 code: DecodeLoadChain, TypeDispatchTarget,
// DecodeAccessor (symbolic execution over every path, following calls and
// jumps into the rest of the input, with and without the facts the
// BoringSSL plan gives it), Compose, ToString, FirstInstructionClass,
// ReturnInstructions and GoEntryProbeAddress.
//
// Promises checked: a decoded chain has at most USAGE_MAX_LOADS loads, of 1,
// 2, 4 or 8 bytes, and a bit field inside its width; DecodeLoadChain's has
// at least one load and no bit field; Compose concatenates the offsets; TypeDispatchTarget is 0 or an
// index into the code; RET addresses ascend inside the code; the Go entry
// probe is the entry or an instruction inside the code.
//
// Input: code bytes, placed at kBase. An accessor's first kPrefixBytes are
// its FunctionCode, as FindFunctions gives it; any address inside the input
// resolves to the bytes from there, as CodeAt reads a library.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "agent/usage/accessor_paths.h"
#include "agent/usage/accessors.h"
#include "agent/usage/elf_functions.h"
#include "agent/usage/go_plan.h"
#include "agent/usage/probe_plan.h"
#include "bpf/usage.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tlsprof::usage::FunctionCode;
using tlsprof::usage::LoadChain;

constexpr uint64_t kBase = 0x401000;

// The code at any address inside the input (up to kPrefixBytes from there).
class Code {
 public:
  explicit Code(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  const FunctionCode* At(uint64_t vaddr) {
    if (vaddr < kBase || vaddr - kBase >= bytes_.size()) return nullptr;
    auto& slot = read_[vaddr];
    if (!slot) {
      slot = std::make_unique<FunctionCode>();
      slot->vaddr = vaddr;
      slot->file_offset = vaddr - kBase;
      const auto from = bytes_.subspan(vaddr - kBase);
      const auto n = std::min(from.size(), tlsprof::usage::kPrefixBytes);
      slot->prefix.assign(from.begin(), from.begin() + static_cast<ptrdiff_t>(n));
    }
    return slot.get();
  }

 private:
  std::span<const uint8_t> bytes_;
  std::map<uint64_t, std::unique_ptr<FunctionCode>> read_;
};

void CheckChain(const std::optional<LoadChain>& c) {
  if (!c) return;
  if (c->offsets.size() > USAGE_MAX_LOADS) __builtin_trap();
  if (c->width != 1 && c->width != 2 && c->width != 4 && c->width != 8) __builtin_trap();
  if (c->shift + c->bits > 8 * c->width) __builtin_trap();
  if (tlsprof::usage::ToString(*c).empty()) __builtin_trap();
}

// The calls into the code under test, on one accessor's code.
void Exercise(std::span<const uint8_t> bytes) {
  using namespace tlsprof::usage;
  Code code(bytes);
  const FunctionCode* entry = code.At(kBase);
  if (!entry) return;

  const std::optional<LoadChain> plain = DecodeLoadChain(bytes);
  CheckChain(plain);
  if (plain && (plain->offsets.empty() || plain->shift || plain->bits || plain->invert)) __builtin_trap();
  for (size_t at : {size_t{0}, size_t{4}, size_t{5}}) {
    const size_t target = TypeDispatchTarget(bytes, at);
    if (target != 0 && target >= bytes.size()) __builtin_trap();
  }

  AccessorContext context;
  context.resolve = [&code](uint64_t vaddr) { return code.At(vaddr); };
  const std::optional<LoadChain> paths = DecodeAccessor(*entry, context);
  CheckChain(paths);
  // As the BoringSSL plan decodes at completion: the pointer SSL_in_init
  // tests is NULL (here: the chain just decoded, without its last load).
  if (paths && paths->offsets.size() >= 2) {
    context.null_pointers.push_back(LoadChain{{paths->offsets.begin(), paths->offsets.end() - 1}, 8});
    CheckChain(DecodeAccessor(*entry, context));
  }
  for (const auto& [first, second] : {std::pair{plain, paths}, std::pair{paths, plain}}) {
    if (!first || !second) continue;
    if (auto composed = Compose(*first, *second)) {
      CheckChain(composed);
      if (composed->offsets.size() != first->offsets.size() + second->offsets.size()) __builtin_trap();
    }
  }

  if (FirstInstructionClass(bytes) >= INSN_NR) __builtin_trap();
  uint64_t last = 0;
  for (uint64_t ret : ReturnInstructions(bytes, kBase)) {
    if (ret < kBase || ret - kBase >= bytes.size() || (last != 0 && ret <= last)) __builtin_trap();
    last = ret;
  }
  const uint64_t probe = GoEntryProbeAddress(bytes, kBase);
  if (probe < kBase || (probe != kBase && probe - kBase >= bytes.size())) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Exercise(std::span<const uint8_t>(data, size));
  return 0;
}
