#include "agent/symbols/test_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
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

std::string MustRun(const std::string& command) {
  auto r = RunCommand(command);
  EXPECT_EQ(r.status, 0) << command << "\n" << r.output;
  return r.output;
}

std::string ReadelfBuildId(const std::string& path) {
  auto r = RunCommand("readelf -n " + path);
  std::smatch m;
  static const std::regex re("Build ID: ([0-9a-f]+)");
  return std::regex_search(r.output, m, re) ? m[1].str() : "";
}

Result<std::shared_ptr<const BinaryImage>> LoadPath(const std::string& path, const LoadOptions& options) {
  auto file = guard::OpenHostFile(path);
  if (!file) return file.error();
  return LoadBinaryImage(*file, ImageOrigin{path, nullptr}, options);
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

std::mt19937 SeededRng(unsigned& seed) {
  std::random_device rd;
  seed = rd();
  std::printf("corruption seed %u\n", seed);
  return std::mt19937(seed);
}

void ForEachCorruptedCopy(const std::vector<uint8_t>& bytes, const std::string& path, size_t begin, size_t end,
                          int rounds, int flips, std::mt19937& rng, const std::function<void()>& check) {
  ASSERT_LE(end, bytes.size());
  for (int round = 0; round < rounds; ++round) {
    std::vector<uint8_t> copy = bytes;
    for (int k = 0; k < flips; ++k) copy[begin + rng() % (end - begin)] ^= static_cast<uint8_t>(1u + rng() % 255);
    WriteFileBytes(path, copy);
    check();
  }
}

LoadOptions NoArchiveNoDebuginfod() {
  LoadOptions o;
  o.debug.static_archive_sonames.clear();
  o.debug.use_debuginfod = false;
  return o;
}

std::shared_ptr<const BinaryImage> LoadFrom(const std::string& path, const LoadOptions& options, SymbolSource source) {
  auto img = LoadPath(path, options);
  EXPECT_TRUE(img) << (img ? "" : img.error().message);
  if (!img) return nullptr;
  EXPECT_EQ((*img)->symbol_source, source) << path;
  return *img;
}

size_t DynsymOnlySize(const std::string& path, LoadOptions options) {
  options.debug.library_tables = false;
  auto dyn = LoadPath(path, options);
  EXPECT_TRUE(dyn) << (dyn ? "" : dyn.error().message);
  if (!dyn) return 0;
  EXPECT_EQ((*dyn)->symbol_source, SymbolSource::kDynsym);
  return (*dyn)->symbols.size();
}

void ExpectFoundInside(const BinaryImage& image, const std::string& name) {
  const Symbol* s = SymbolNamed(image, name);
  ASSERT_NE(s, nullptr) << name;
  auto found = image.symbols.Find(s->addr + s->size / 2);
  ASSERT_TRUE(found) << name;
  EXPECT_EQ(image.symbols.at(*found).name, name);
}

}  // namespace tlsprof::symbols::symtest
