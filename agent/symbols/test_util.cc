#include "agent/symbols/test_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "common/fd.h"

namespace tlsprof::symbols::symtest {

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr ? tmp : "/tmp") + "/tlsprof-symbols-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool HaveTool(const std::string& name) { return RunCommand("command -v " + name).status == 0; }

Result<std::shared_ptr<const BinaryImage>> LoadPath(const std::string& path, const LoadOptions& options) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return MakeError("cannot open {}", path);
  return LoadBinaryImage(fd.get(), path, options);
}

const Symbol* SymbolNamed(const BinaryImage& image, const std::string& name) {
  for (const Symbol& s : image.symbols.all()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

uint64_t AddrOf(const BinaryImage& image, const std::string& name) {
  const Symbol* s = SymbolNamed(image, name);
  return s != nullptr ? s->addr : 0;
}

CommandResult BuildTestLibrary(const TempDir& dir, const std::string& stem, const std::string& soname,
                               const std::string& cflags, const std::string& source, const std::string& libs) {
  return RunCommand("cd " + dir.path() + " && cc " + cflags + " -fPIC -shared -Wl,-soname," + soname + " -o " + stem +
                    ".so " TLSPROF_SOURCE_DIR "/agent/symbols/testdata/" + source + " " + libs +
                    " && strip --strip-all -o " + stem + ".stripped.so " + stem + ".so");
}

std::map<std::string, std::string> TableNamesByRealName(const BinaryImage& full,
                                                        const std::vector<TableFunction>& functions) {
  std::map<std::string, std::string> got;
  for (const TableFunction& f : functions) {
    auto i = full.symbols.Find(f.addr);
    if (!i) {
      ADD_FAILURE() << f.name << " is not at a function";
      continue;
    }
    const Symbol& real = full.symbols.at(*i);
    EXPECT_EQ(real.addr, f.addr) << f.name;
    EXPECT_EQ(real.size, f.size) << f.name;
    got[real.name] = f.name;
  }
  return got;
}

void ExpectTruncatedCopiesFail(const std::vector<uint8_t>& bytes, const std::string& path,
                               const std::function<bool(const std::string&)>& reads) {
  for (size_t len : {size_t{0}, size_t{3}, size_t{64}, size_t{4096}, bytes.size() / 3, bytes.size() - 1}) {
    WriteFileBytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len)));
    if (len < bytes.size() / 2) {
      EXPECT_FALSE(reads(path)) << "truncated to " << len;
    }
  }
}

}  // namespace tlsprof::symbols::symtest
