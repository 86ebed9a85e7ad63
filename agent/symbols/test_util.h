// Helpers shared by the symbols tests: temp dirs, files, commands.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/library_tables.h"
#include "common/result.h"

namespace tlsprof::symbols::symtest {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> ReadFileBytes(const std::string& path);
void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes);

// Runs `command` through /bin/sh; returns its exit status and stdout+stderr.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);
bool HaveTool(const std::string& name);  // on $PATH

// Opens `path` and loads it.
Result<std::shared_ptr<const BinaryImage>> LoadPath(const std::string& path, const LoadOptions& options = {});

// Address of the symbol named `name` (first match), or 0.
uint64_t AddrOf(const BinaryImage& image, const std::string& name);
const Symbol* SymbolNamed(const BinaryImage& image, const std::string& name);

// Builds agent/symbols/testdata/`source` into DIR/`stem`.so with
// `cc -fPIC -shared -Wl,-soname,<soname> <cflags> ... <libs>` (keeping its
// .symtab: the truth of a tables test) and strips a copy to
// DIR/`stem`.stripped.so (what the reader sees).
CommandResult BuildTestLibrary(const TempDir& dir, const std::string& stem, const std::string& soname,
                               const std::string& cflags, const std::string& source, const std::string& libs = "");

// The functions a tables reader named, by the name `full` (the same library
// with its .symtab) gives their address: real name -> table name. Adds a test
// failure for a function at no real function's address or with another
// extent.
std::map<std::string, std::string> TableNamesByRealName(const BinaryImage& full,
                                                        const std::vector<TableFunction>& functions);

// Writes truncated copies of `bytes` (0, 3, 64 and 4096 bytes, a third, all
// but the last byte) to `path` and adds a test failure for each copy shorter
// than half the file that `reads(path)` accepts.
void ExpectTruncatedCopiesFail(const std::vector<uint8_t>& bytes, const std::string& path,
                               const std::function<bool(const std::string&)>& reads);

}  // namespace tlsprof::symbols::symtest
