// Reading a stripped library's machine code without running it, for the
// readers that name its functions from its own tables (boringssl_tables.h,
// library_tables.h). Two views of a function, both from capstone:
//   Execute  a straight-line interpreter, just enough for getters and
//            once-inits: constants loaded into registers (lea [rip+X], mov
//            imm, xor r,r, mov r,r), the stores of such constants to
//            rip-relative memory, and direct calls with their first two
//            arguments. It stops at `ret` (the run returned) or at the first
//            branch, indirect jump or unknown control flow (it did not).
//            Nothing it does not model is trusted: an instruction it does
//            not know forgets the registers it writes.
//   Scan     a linear sweep of a function's extent: the targets of its
//            direct calls and jumps and the addresses its rip-relative
//            `lea`s take, whatever the path to them (a getter that picks one
//            of several structs with cmov or a branch lists them all).
// An X86Interpreter reads one LoaderImage, which must outlive it. It is not
// thread-safe (one capstone handle); use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "agent/symbols/loader_image.h"

namespace tlsprof::symbols {

// A general-purpose register as capstone names it at any width (x86_reg):
// its index 0..15 (rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15) and its
// width in bytes; index -1 for any other register.
struct X86Gpr {
  int index = -1;
  int width = 0;
};
X86Gpr X86GprOf(unsigned capstone_reg);

struct X86Store {
  uint64_t addr = 0;
  uint8_t size = 0;
  std::optional<uint64_t> value;  // nullopt: something not a constant (a vector register, a load)
};

struct X86Call {
  uint64_t target = 0;
  std::optional<uint64_t> rdi, rsi;
};

struct X86Run {
  std::vector<X86Store> stores;
  std::vector<X86Call> calls;
  std::optional<uint64_t> rax;  // at `ret`
  bool returned = false;
};

struct X86Refs {
  std::vector<uint64_t> calls;  // direct call and jmp targets outside [fn, fn+len), in code order
  std::vector<uint64_t> leas;   // lea [rip+X]: X, in code order
  bool complete = false;        // the sweep decoded every byte of the extent
};

class X86Interpreter {
 public:
  explicit X86Interpreter(const LoaderImage& image);
  ~X86Interpreter();
  X86Interpreter(const X86Interpreter&) = delete;
  X86Interpreter& operator=(const X86Interpreter&) = delete;

  // False if capstone failed to start; every call then gives nothing.
  bool ok() const;

  // Runs the code at `fn` (in a code segment) from its first instruction.
  X86Run Execute(uint64_t fn);

  // Sweeps [fn, fn+len) (len at most 64 KiB); stops early at bytes that do
  // not decode.
  X86Refs Scan(uint64_t fn, uint64_t len);

  // Whether a direct call to `target` calls the export `name`: `target` is
  // its address, or a PLT stub (`jmp [rip+slot]`, after an endbr64 or with a
  // bnd prefix) whose slot's JUMP_SLOT relocation names it. Needs the image
  // loaded with LoaderImageOptions::symbol_names.
  bool CallsExport(uint64_t target, std::string_view name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tlsprof::symbols
