// Debug links and build-ids (agent/symbols/debug_sources.h, binary_image.h):
// the .gnu_debuglink parser, the build-id note reader, and the whole search
// for a separate debug file that LoadBinaryImage does for a stripped binary:
// the debug file found by its debuglink name (with its CRC) and by its
// build-id in a .build-id tree, then merged with the binary's .dynsym.
//
// Input: u32 little-endian length N, N bytes of the binary, then the bytes of
// the debug file. The debug file is written where both searches look: as
// fuzz.debug next to the binary (the seeds' debuglink name) and under
// .build-id/ for the binary's build-id, in a private directory (on /dev/shm
// when there is one) that is removed at exit.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/debug_sources.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;

struct Dirs {
  std::string top, bin, debug;
};

// Never destroyed: the atexit handler that removes the directory runs after
// static destructors registered before it.
const Dirs& Tmp() {
  static const Dirs& dirs = *[] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : fs::temp_directory_path().string();
    std::string tmpl = base + "/tlsprof-debuglink-fuzz.XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    auto* d = new Dirs{tmpl, tmpl + "/bin", tmpl + "/debug"};
    fs::create_directories(d->bin);
    fs::create_directories(d->debug);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(Tmp().top, ec);
    });
    return d;
  }();
  return dirs;
}

// False when the path cannot be created (a build-id too long for a file name).
bool WriteFile(const std::string& path, std::span<const uint8_t> bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  close(fd);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  (void)Tmp();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::symbols;
  // The section parser alone, on the raw input, in both byte orders.
  for (bool big_endian : {false, true}) {
    if (auto link = ParseDebugLink(std::span<const uint8_t>(data, size), big_endian)) {
      if (link->name.empty() || link->name.find('/') != std::string::npos) __builtin_trap();
      (void)BesideCandidates("/usr/lib", link->name);
      (void)DebugRootCandidates("/usr/lib", link->name, {"/usr/lib/debug"});
    }
  }

  const uint8_t* p = data;
  size_t left = size;
  const uint32_t n = tlsprof::fuzz::TakeU32(p, left);
  if (n > left) return 0;
  std::span<const uint8_t> binary(p, n), debug(p + n, left - n);

  const Dirs& dirs = Tmp();
  const tlsprof::guard::GuardedFile file = tlsprof::fuzz::GuardedMemFile(binary.data(), binary.size());
  auto build_id = ReadBuildId(file);
  std::vector<std::string> written;
  written.push_back(dirs.bin + "/fuzz.debug");
  if (build_id) {
    for (const char c : *build_id) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) __builtin_trap();  // hex, as documented
    }
    for (const std::string& path : BuildIdCandidates(*build_id, {dirs.debug})) written.push_back(path);
  }
  std::erase_if(written, [&](const std::string& path) { return !WriteFile(path, debug); });

  LoadOptions options;
  options.debug.debug_roots = {dirs.debug};
  options.debug.use_debuginfod = false;
  options.debug.static_archive_sonames.clear();
  // The binary "is" /fuzz.elf in a process whose root is dirs.bin.
  static const auto root = std::make_shared<const tlsprof::guard::ProcessRoot>(
      std::move(tlsprof::guard::ProcessRoot::OpenDirectory(dirs.bin).value()));
  auto image = LoadBinaryImage(file, ImageOrigin{"/fuzz.elf", root}, options);
  if (image) {
    for (const Symbol& s : (*image)->symbols.all()) (void)(*image)->symbols.Find(s.addr);
  }
  for (const std::string& path : written) unlink(path.c_str());
  return 0;
}
