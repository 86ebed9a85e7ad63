// Separate debug files for stripped libraries: a library is built here with
// symbols, its debug file split off with `objcopy --only-keep-debug`, and the
// library stripped; LoadBinaryImage must find the static function's name again
// through .gnu_debuglink, a .build-id tree or a real local debuginfod.
#include "agent/symbols/debug_sources.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

namespace fs = std::filesystem;
using namespace symtest;
using Clock = std::chrono::steady_clock;

constexpr const char* kStaticName = "tlsprof_dbg_static_helper";
constexpr const char* kApiName = "tlsprof_dbg_api_encrypt";

// A static (file-local) function that must not be inlined, so it only has a
// name in .symtab; two exported ones that stay in .dynsym after stripping.
constexpr const char* kLibSource = R"(
__attribute__((noinline)) static unsigned tlsprof_dbg_static_helper(unsigned x) {
  __asm__ volatile("" ::: "memory");
  return x * 2654435761u + 7;
}
__attribute__((noinline, visibility("hidden"))) unsigned tlsprof_dbg_hidden(unsigned x) {
  __asm__ volatile("" ::: "memory");
  return tlsprof_dbg_static_helper(x) ^ 0x5a5a;
}
unsigned tlsprof_dbg_api_encrypt(unsigned x) { return tlsprof_dbg_hidden(x) + tlsprof_dbg_static_helper(x + 1); }
unsigned tlsprof_dbg_api_decrypt(unsigned x) { return tlsprof_dbg_static_helper(x) - 3; }
)";

// Libraries built once for the whole suite.
struct Artifacts {
  TempDir dir;
  std::string full;            // built with -g: has .symtab
  std::string stripped;        // --strip-all, no debuglink
  std::string linked;          // stripped, with .gnu_debuglink=lib.debug
  std::string debug;           // objcopy --only-keep-debug of `full`
  std::string build_id;        // of full/stripped/linked/debug
  std::string other_stripped;  // a different library (different build-id)
  std::string other_debug;     // its debug file
  std::string other_build_id;
};

Artifacts* g_art = nullptr;

class DebugSourcesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* tool : {"gcc", "objcopy", "strip", "readelf"}) {
      ASSERT_TRUE(symtest::HaveTool(tool)) << tool << " is missing; run scripts/install-deps.sh";
    }
    g_art = new Artifacts;
    Artifacts& a = *g_art;
    const std::string d = a.dir.path();
    std::ofstream(d + "/lib.c") << kLibSource;
    std::ofstream(d + "/other.c") << kLibSource << "unsigned tlsprof_dbg_other(unsigned x) { return x + 1; }\n";
    auto build = [&](const std::string& stem) {
      MustRun("gcc -g -O2 -fPIC -shared -Wl,--build-id -o " + d + "/" + stem + "-full.so " + d + "/" + stem + ".c");
      MustRun("objcopy --only-keep-debug " + d + "/" + stem + "-full.so " + d + "/" + stem + ".debug");
      MustRun("cp " + d + "/" + stem + "-full.so " + d + "/" + stem + "-stripped.so && strip --strip-all " + d + "/" +
              stem + "-stripped.so");
    };
    build("lib");
    build("other");
    a.full = d + "/lib-full.so";
    a.stripped = d + "/lib-stripped.so";
    a.debug = d + "/lib.debug";
    a.linked = d + "/lib-linked.so";
    // objcopy reads lib.debug to compute the CRC and records only its base name.
    MustRun("cd " + d + " && cp lib-stripped.so lib-linked.so && objcopy --add-gnu-debuglink=lib.debug lib-linked.so");
    a.other_stripped = d + "/other-stripped.so";
    a.other_debug = d + "/other.debug";
    a.build_id = ReadelfBuildId(a.stripped);
    a.other_build_id = ReadelfBuildId(a.other_stripped);
    ASSERT_EQ(a.build_id.size(), 40u);
    ASSERT_EQ(ReadelfBuildId(a.debug), a.build_id);
    ASSERT_NE(a.other_build_id, a.build_id);
  }
  static void TearDownTestSuite() {
    delete g_art;
    g_art = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(g_art, nullptr);
    options_.debug.debug_roots = {root_.path()};
    options_.debug.use_debuginfod = false;
  }

  // The origin of a file seen as `display_path` by a process whose root is
  // the directory `root` ("": the agent's own root, display_path "": the
  // file's own path).
  static ImageOrigin Origin(const std::string& path, std::string_view display_path, std::string_view root) {
    ImageOrigin origin{display_path.empty() ? path : std::string(display_path), nullptr};
    if (!root.empty()) {
      auto r = guard::ProcessRoot::OpenDirectory(std::string(root));
      EXPECT_TRUE(r.ok()) << r.error().message;
      if (r) origin.root = std::make_shared<const guard::ProcessRoot>(std::move(*r));
    }
    return origin;
  }

  static Result<std::shared_ptr<const BinaryImage>> Load(const std::string& path, const LoadOptions& options,
                                                         std::string_view display_path = {},
                                                         std::string_view root = {}) {
    auto file = guard::OpenHostFile(path);
    if (!file) return file.error();
    return LoadBinaryImage(*file, Origin(path, display_path, root), options);
  }

  // Loads `path` (as `display_path` in the root `root`, when given) with
  // options_ and checks where its names came from; null (after a test
  // failure) when it does not load.
  std::shared_ptr<const BinaryImage> LoadExpecting(SymbolSource source, const std::string& path,
                                                   std::string_view display_path = {}, std::string_view root = {}) {
    auto img = Load(path, options_, display_path, root);
    EXPECT_TRUE(img.ok()) << (img.ok() ? "" : img.error().message);
    if (!img.ok()) return nullptr;
    EXPECT_EQ((*img)->symbol_source, source) << path;
    return *img;
  }

  // Copies `from` to `to`, creating parent directories.
  static void Place(const std::string& from, const std::string& to) {
    fs::create_directories(fs::path(to).parent_path());
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  }

  std::string BuildIdPath(const std::string& root, const std::string& build_id) const {
    return root + "/.build-id/" + build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
  }

  // The static function resolves, at the address the unstripped build gives it.
  void ExpectFullSymbols(const BinaryImage& img) {
    auto full = symtest::LoadPath(g_art->full);
    ASSERT_TRUE(full.ok()) << full.error().message;
    const uint64_t want = AddrOf(**full, kStaticName);
    ASSERT_NE(want, 0u);
    EXPECT_EQ(AddrOf(img, kStaticName), want);
    auto idx = img.symbols.Find(want + 1);
    ASSERT_TRUE(idx.has_value());
    EXPECT_EQ(img.symbols.at(*idx).name, kStaticName);
    EXPECT_NE(SymbolNamed(img, "tlsprof_dbg_hidden"), nullptr);
    EXPECT_EQ(AddrOf(img, kApiName), AddrOf(**full, kApiName));
    EXPECT_EQ(img.build_id, g_art->build_id);
  }

  TempDir work_;  // per test: where libraries are placed
  TempDir root_;  // per test: the debug root (empty unless a test fills it)
  LoadOptions options_;
};

TEST_F(DebugSourcesTest, StrippedLibraryWithoutDebugFileUsesDynsym) {
  auto img = LoadExpecting(SymbolSource::kDynsym, g_art->stripped);
  ASSERT_NE(img, nullptr);
  EXPECT_NE(SymbolNamed(*img, kApiName), nullptr);
  EXPECT_EQ(SymbolNamed(*img, kStaticName), nullptr);
}

// Where a .gnu_debuglink file is looked for: next to the file, in its
// .debug/, next to it inside the process's root when the path (as in
// /proc/PID/maps) is the path inside a container, and under the debug root
// at the in-namespace directory (as Debian lays out
// /usr/lib/debug/usr/lib/x86_64-linux-gnu/...). Only the last is the host's
// own: the others are the tenant's files, and the image says so.
TEST_F(DebugSourcesTest, DebugLinkFoundInEachPlace) {
  struct Place {
    std::string debug;
    std::string display_path;  // "": the file's own path
    std::string root;          // the process's root; "": the agent's
    bool tenant;
  };
  const Place places[] = {
      {work_.File("lib.debug"), "", "", true},
      {work_.File(".debug/lib.debug"), "", "", true},
      {work_.File("lib.debug"), "/lib.so", work_.path(), true},
      {root_.path() + "/opt/tlsprof-test/lib.debug", "/opt/tlsprof-test/lib.so", work_.path(), false},
  };
  DebugSourcesTest::Place(g_art->linked, work_.File("lib.so"));
  for (const Place& p : places) {
    SCOPED_TRACE(p.debug + " for " + p.display_path);
    DebugSourcesTest::Place(g_art->debug, p.debug);
    auto img = LoadExpecting(SymbolSource::kDebugLink, work_.File("lib.so"), p.display_path, p.root);
    ASSERT_NE(img, nullptr);
    ExpectFullSymbols(*img);
    EXPECT_EQ(img->tenant_sources, p.tenant);
    fs::remove(p.debug);
  }
}

// A container's debuglink name that is an absolute symlink resolves inside
// its root: a debug file on the host at that path is never read.
TEST_F(DebugSourcesTest, DebugLinkSymlinkStaysInsideTheRoot) {
  TempDir container;
  DebugSourcesTest::Place(g_art->linked, container.File("usr/lib/lib.so"));
  DebugSourcesTest::Place(g_art->debug, work_.File("host-copy.debug"));  // the right file, on the host
  fs::create_symlink(work_.File("host-copy.debug"), container.File("usr/lib/lib.debug"));
  auto img =
      LoadExpecting(SymbolSource::kDynsym, container.File("usr/lib/lib.so"), "/usr/lib/lib.so", container.path());
  ASSERT_NE(img, nullptr);
  EXPECT_EQ(SymbolNamed(*img, kStaticName), nullptr);
  // The same link, relative and inside the root, is followed.
  fs::remove(container.File("usr/lib/lib.debug"));
  DebugSourcesTest::Place(g_art->debug, container.File("usr/lib/debug-files/lib.debug"));
  fs::create_symlink("/usr/lib/debug-files/lib.debug", container.File("usr/lib/lib.debug"));
  auto inside =
      LoadExpecting(SymbolSource::kDebugLink, container.File("usr/lib/lib.so"), "/usr/lib/lib.so", container.path());
  ASSERT_NE(inside, nullptr);
  ExpectFullSymbols(*inside);
}

TEST_F(DebugSourcesTest, DebugLinkWithWrongCrcIsRejected) {
  Place(g_art->linked, work_.File("lib.so"));
  Place(g_art->other_debug, work_.File("lib.debug"));  // right name, wrong contents
  auto img = LoadExpecting(SymbolSource::kDynsym, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
  EXPECT_EQ(SymbolNamed(*img, kStaticName), nullptr);
}

TEST_F(DebugSourcesTest, BuildIdDirUnderDebugRoot) {
  Place(g_art->stripped, work_.File("lib.so"));
  Place(g_art->debug, BuildIdPath(root_.path(), g_art->build_id));
  auto img = LoadExpecting(SymbolSource::kBuildIdDebugDir, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
  ExpectFullSymbols(*img);
  // Merged with .dynsym, as for a file with its own .symtab: the exported
  // names are there once each.
  int api_count = 0;
  for (const Symbol& s : img->symbols.all()) api_count += s.name == kApiName;
  EXPECT_EQ(api_count, 1);
}

TEST_F(DebugSourcesTest, DebugLinkComesBeforeBuildIdDir) {
  Place(g_art->linked, work_.File("lib.so"));
  Place(g_art->debug, work_.File("lib.debug"));
  Place(g_art->debug, BuildIdPath(root_.path(), g_art->build_id));
  auto img = LoadExpecting(SymbolSource::kDebugLink, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
}

// (e) A debug file of another build at the build-id path is rejected; the
// search goes on to the next root, which has the right one.
TEST_F(DebugSourcesTest, MismatchedBuildIdIsRejected) {
  TempDir second_root;
  options_.debug.debug_roots = {root_.path(), second_root.path()};
  Place(g_art->stripped, work_.File("lib.so"));
  Place(g_art->other_debug, BuildIdPath(root_.path(), g_art->build_id));
  {
    auto img = LoadExpecting(SymbolSource::kDynsym, work_.File("lib.so"));
    ASSERT_NE(img, nullptr);
    EXPECT_EQ(SymbolNamed(*img, kStaticName), nullptr);
    EXPECT_EQ(SymbolNamed(*img, "tlsprof_dbg_other"), nullptr);
  }
  Place(g_art->debug, BuildIdPath(second_root.path(), g_art->build_id));
  auto img = LoadExpecting(SymbolSource::kBuildIdDebugDir, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
  ExpectFullSymbols(*img);
}

// (f) Truncated debug files: skipped, never a crash or an error for the
// library itself.
TEST_F(DebugSourcesTest, TruncatedDebugFileIsSkipped) {
  Place(g_art->stripped, work_.File("lib.so"));
  const std::vector<uint8_t> whole = ReadFileBytes(g_art->debug);
  ASSERT_GT(whole.size(), 4096u);
  const std::string target = BuildIdPath(root_.path(), g_art->build_id);
  for (size_t len : {size_t{0}, size_t{16}, size_t{64}, size_t{1000}, whole.size() / 2, whole.size() - 1}) {
    SCOPED_TRACE("debug file truncated to " + std::to_string(len) + " bytes");
    WriteFileBytes(target, std::vector<uint8_t>(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(len)));
    auto img = LoadExpecting(SymbolSource::kDynsym, work_.File("lib.so"));
    ASSERT_NE(img, nullptr);
    EXPECT_NE(SymbolNamed(*img, kApiName), nullptr);
  }
}

// A FIFO where a debug file is expected must not block the load.
TEST_F(DebugSourcesTest, FifoInPlaceOfDebugFileDoesNotBlock) {
  Place(g_art->stripped, work_.File("lib.so"));
  const std::string target = BuildIdPath(root_.path(), g_art->build_id);
  fs::create_directories(fs::path(target).parent_path());
  ASSERT_EQ(mkfifo(target.c_str(), 0600), 0);
  auto img = LoadExpecting(SymbolSource::kDynsym, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
}

TEST_F(DebugSourcesTest, KeepFilterAppliesToDebugSymbols) {
  Place(g_art->stripped, work_.File("lib.so"));
  Place(g_art->debug, BuildIdPath(root_.path(), g_art->build_id));
  options_.keep = [](std::string_view name) { return name == kStaticName; };
  auto img = LoadExpecting(SymbolSource::kBuildIdDebugDir, work_.File("lib.so"));
  ASSERT_NE(img, nullptr);
  ASSERT_EQ(img->symbols.size(), 1u);
  EXPECT_EQ(img->symbols.at(0).name, kStaticName);
  EXPECT_GT(img->symbols_seen, 3u);  // counted before the filter
}

TEST_F(DebugSourcesTest, ImageCachePassesTheOrigin) {
  Place(g_art->linked, work_.File("lib.so"));
  Place(g_art->debug, work_.File("lib.debug"));
  ImageCache cache(options_);
  auto file = guard::OpenHostFile(work_.File("lib.so"));
  ASSERT_TRUE(file.ok());
  auto img = cache.Get(*file, Origin(work_.File("lib.so"), "/lib.so", work_.path()));
  ASSERT_TRUE(img.ok()) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kDebugLink);
}

// Copies of one file (another container's layer) share an image, but only
// one named from the file and the host alone: a copy whose names came from
// a debug file beside it keeps them to itself, and a file that only claims
// another's build-id never gets another's image.
TEST_F(DebugSourcesTest, ImageCacheSharesByContentNeverByBuildId) {
  Place(g_art->linked, work_.File("a/lib.so"));
  Place(g_art->linked, work_.File("b/lib.so"));
  Place(g_art->linked, work_.File("c/lib.so"));
  Place(g_art->debug, work_.File("c/lib.debug"));  // beside c only
  Place(g_art->stripped, work_.File("d/lib.so"));  // same build-id, other content
  ImageCache cache(options_);
  auto get = [&](const std::string& dir) {
    auto file = guard::OpenHostFile(work_.File(dir + "/lib.so"));
    EXPECT_TRUE(file.ok());
    auto img = cache.Get(*file, Origin(work_.File(dir + "/lib.so"), "/lib.so", work_.File(dir)));
    EXPECT_TRUE(img.ok()) << img.error().message;
    return *img;
  };
  auto c = get("c"), a = get("a"), b = get("b"), d = get("d");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->symbol_source, SymbolSource::kDynsym);
  EXPECT_NE(c.get(), a.get());
  EXPECT_EQ(c->symbol_source, SymbolSource::kDebugLink);
  EXPECT_TRUE(c->tenant_sources);
  EXPECT_EQ(d->build_id, a->build_id);
  EXPECT_NE(d.get(), a.get());
  EXPECT_NE(d.get(), c.get());
  EXPECT_EQ(cache.size(), 4u);  // a and b are one image under two identities
  a.reset();
  b.reset();
  c.reset();
  d.reset();
  cache.Prune();
  EXPECT_EQ(cache.size(), 0u);
}

TEST(DebugLinkTest, ParseAndCandidates) {
  const uint8_t le[] = {'a', '.', 'd', 'e', 'b', 'u', 'g', 0, 0x78, 0x56, 0x34, 0x12};
  auto link = ParseDebugLink(le, /*big_endian=*/false);
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->name, "a.debug");
  EXPECT_EQ(link->crc, 0x12345678u);
  EXPECT_EQ(ParseDebugLink(le, /*big_endian=*/true)->crc, 0x78563412u);
  const uint8_t short_crc[] = {'a', 0, 0, 0, 1, 2};
  EXPECT_FALSE(ParseDebugLink(short_crc, false).has_value());
  const uint8_t no_nul[] = {'a', 'b', 'c', 'd'};
  EXPECT_FALSE(ParseDebugLink(no_nul, false).has_value());
  const uint8_t slash[] = {'.', '.', '/', 'x', 0, 0, 0, 0, 1, 2, 3, 4};
  EXPECT_FALSE(ParseDebugLink(slash, false).has_value());
  // An empty .gnu_debuglink section: libelf gives no buffer at all.
  EXPECT_FALSE(ParseDebugLink(std::span<const uint8_t>(), false).has_value());

  EXPECT_EQ(BesideCandidates("/usr/lib", "x.debug"),
            (std::vector<std::string>{"/usr/lib/x.debug", "/usr/lib/.debug/x.debug"}));
  EXPECT_EQ(DebugRootCandidates("/usr/lib", "x.debug", {"/usr/lib/debug", "/r/"}),
            (std::vector<std::string>{"/usr/lib/debug/usr/lib/x.debug", "/r/usr/lib/x.debug"}));
  EXPECT_TRUE(BesideCandidates("lib", "x.debug").empty());
  EXPECT_EQ(BuildIdCandidates("abcdef", {"/r1", "/r2/"}),
            (std::vector<std::string>{"/r1/.build-id/ab/cdef.debug", "/r2/.build-id/ab/cdef.debug"}));
  EXPECT_TRUE(BuildIdCandidates("ab", {"/r"}).empty());
}

TEST_F(DebugSourcesTest, SystemLibcryptoWithoutDebugFilesIsDynsym) {
  if (!fs::exists(kLibcrypto)) GTEST_SKIP() << kLibcrypto << " is not installed";
  // Without libssl-dev's libcrypto.a (archive_match_test) and the library's
  // own tables (library_tables_test) as the last resorts.
  options_.debug.static_archive_sonames.clear();
  options_.debug.library_tables = false;
  auto img = LoadExpecting(SymbolSource::kDynsym, kLibcrypto);
  ASSERT_NE(img, nullptr);
  EXPECT_NE(SymbolNamed(*img, "EVP_EncryptUpdate"), nullptr);
}

// --- debuginfod ------------------------------------------------------------

// Sets an environment variable for one scope, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort() {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  socklen_t len = sizeof addr;
  getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// HTTP status of GET http://127.0.0.1:port/path, or 0 if there is no answer.
int HttpStatus(int port, const std::string& path) {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{2, 0};
  setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 0;
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(s.get(), req.data(), req.size()) != static_cast<ssize_t>(req.size())) return 0;
  char buf[64] = {};
  ssize_t n = read(s.get(), buf, sizeof buf - 1);
  int status = 0;
  if (n > 0) std::sscanf(buf, "HTTP/%*s %d", &status);
  return status;
}

// A real debuginfod serving one directory (-F), on a free port, stopped by
// PID on destruction.
class DebuginfodServer {
 public:
  DebuginfodServer(const std::string& serve_dir, const std::string& state_dir) {
    port_ = FreePort();
    const std::string port = std::to_string(port_);
    const std::string db = state_dir + "/db.sqlite";
    log_ = state_dir + "/debuginfod.log";
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
      }
      execlp("debuginfod", "debuginfod", "-F", serve_dir.c_str(), "-p", port.c_str(), "-d", db.c_str(), "-v",
             static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~DebuginfodServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  DebuginfodServer(const DebuginfodServer&) = delete;
  DebuginfodServer& operator=(const DebuginfodServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return RunCommand("tail -n 30 " + log_).output; }

  // Polls until the server answers 200 for the build-id's debuginfo (its
  // first scan has indexed the file), or the server died, or the deadline.
  bool WaitServes(const std::string& build_id, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (pid_ <= 0 || waitpid(pid_, nullptr, WNOHANG) != 0) return false;
      if (HttpStatus(port_, "/buildid/" + build_id + "/debuginfo") == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  int port_ = -1;
  pid_t pid_ = -1;
  std::string log_;
};

// (d) The debug file comes from a real debuginfod through libdebuginfod, and
// lands in libdebuginfod's cache.
TEST_F(DebugSourcesTest, Debuginfod) {
  ASSERT_TRUE(symtest::HaveTool("debuginfod")) << "debuginfod is missing; run scripts/install-deps.sh";
  TempDir serve, state, cache;
  Place(g_art->debug, serve.path() + "/lib.debug");
  DebuginfodServer server(serve.path(), state.path());
  ASSERT_TRUE(server.WaitServes(g_art->build_id, std::chrono::seconds(60))) << server.log();

  ScopedEnv urls("DEBUGINFOD_URLS", server.url());
  ScopedEnv cache_path("DEBUGINFOD_CACHE_PATH", cache.path());
  EXPECT_TRUE(DebugSearch::DefaultUseDebuginfod());
  options_.debug.use_debuginfod = true;
  Place(g_art->stripped, work_.File("lib.so"));
  auto img = Load(work_.File("lib.so"), options_);
  ASSERT_TRUE(img.ok()) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kDebuginfod) << server.log();
  ExpectFullSymbols(**img);
  EXPECT_TRUE(fs::exists(cache.path() + "/" + g_art->build_id + "/debuginfo"));
}

// (g) A build-id no server has, with a dead URL: answered quickly, asked once
// per run, then from the negative cache.
TEST_F(DebugSourcesTest, DebuginfodNegativeCache) {
  TempDir cache;
  ScopedEnv urls("DEBUGINFOD_URLS", "http://127.0.0.1:" + std::to_string(FreePort()));
  ScopedEnv cache_path("DEBUGINFOD_CACHE_PATH", cache.path());
  options_.debug.use_debuginfod = true;
  Place(g_art->other_stripped, work_.File("other.so"));

  const DebuginfodStats before = GetDebuginfodStats();
  const auto start = Clock::now();
  auto img = LoadExpecting(SymbolSource::kDynsym, work_.File("other.so"));
  ASSERT_NE(img, nullptr);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  const DebuginfodStats after_first = GetDebuginfodStats();
  EXPECT_EQ(after_first.queries, before.queries + 1);

  auto again = Load(work_.File("other.so"), options_);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ((*again)->symbol_source, SymbolSource::kDynsym);
  const DebuginfodStats after_second = GetDebuginfodStats();
  EXPECT_EQ(after_second.queries, after_first.queries);
  EXPECT_EQ(after_second.negative_hits, after_first.negative_hits + 1);
}

// A server that accepts the connection but never answers: the query is
// cancelled at our timeout, not libdebuginfod's (90 s by default).
TEST(DebuginfodTimeoutTest, SilentServerIsCutOffAtTheTimeout) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener.get(), 16), 0);  // the kernel completes handshakes; nobody replies
  socklen_t len = sizeof addr;
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  TempDir cache;
  ScopedEnv urls("DEBUGINFOD_URLS", "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  ScopedEnv cache_path("DEBUGINFOD_CACHE_PATH", cache.path());
  ScopedEnv timeout("DEBUGINFOD_TIMEOUT", "90");

  // A build-id unique to this run: the negative cache would answer a repeat.
  const std::string build_id =
      fmt::format("{:08x}{:016x}{:016x}", static_cast<uint32_t>(getpid()),
                  static_cast<uint64_t>(Clock::now().time_since_epoch().count()), GetDebuginfodStats().queries);
  const auto start = Clock::now();
  auto fd = FetchFromDebuginfod(build_id, std::chrono::milliseconds(1500));
  const auto elapsed = Clock::now() - start;
  EXPECT_FALSE(fd.ok());
  EXPECT_GE(elapsed, std::chrono::milliseconds(1400));
  EXPECT_LT(elapsed, std::chrono::milliseconds(4000));
}

}  // namespace
}  // namespace tlsprof::symbols
