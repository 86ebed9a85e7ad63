#include "agent/symbols/object_layout.h"

#include <gelf.h>
#include <gtest/gtest.h>
#include <libelf.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <string>

#include "agent/classify/classify.h"
#include "agent/symbols/test_util.h"

namespace tlsprof::symbols {
namespace {

using symtest::RunCommand;
using symtest::TempDir;

// Lays out functions 0x10 bytes apart: {name, object (-1 global), selected}.
struct Spec {
  const char* name;
  int32_t object;
  bool selected;
};

std::set<std::string> Selected(const std::vector<Spec>& specs) {
  std::vector<LinkedFunction> fs;
  uint64_t addr = 0x1000;
  for (const Spec& s : specs) {
    fs.push_back({addr, 0x10, s.name, s.object, s.selected});
    addr += 0x10;
  }
  SelectWholeObjects(fs);
  std::set<std::string> out;
  for (const auto& f : fs) {
    if (f.selected) out.insert(std::string(f.name));
  }
  return out;
}

TEST(ObjectLayoutTest, ASegmentWithASelectedFunctionIsSelectedWhole) {
  // Object 1: locals a and c with the global B between them; B is selected.
  EXPECT_EQ(Selected({{"main", 0, false},
                      {"a", 1, false},
                      {"B", -1, true},
                      {"c", 1, false},
                      {"d", 2, false},
                      {"exit", -1, false}}),
            (std::set<std::string>{"a", "B", "c"}));
}

TEST(ObjectLayoutTest, AnObjectsLeadingLocalBetweenSelectedGlobalsIsSelected) {
  // OpenSSL's lhash.o: `getrn` first, then OPENSSL_LH_*; the object before
  // ends with selected globals.
  EXPECT_EQ(Selected({{"EVP_PKEY_verify_recover", -1, true},
                      {"getrn", 7, false},
                      {"OPENSSL_LH_new", -1, true},
                      {"OPENSSL_LH_free", -1, true}}),
            (std::set<std::string>{"EVP_PKEY_verify_recover", "getrn", "OPENSSL_LH_new", "OPENSSL_LH_free"}));
}

TEST(ObjectLayoutTest, RunsThatMixObjectsOrTouchTheEndsAreNotSelected) {
  // zlib's deflate.o and inflate.o between libssl.a and libcrypto.a; the
  // program before the library and libc after it.
  EXPECT_EQ(Selected({{"main", 0, false},
                      {"helper", 0, false},
                      {"SSL_new", -1, true},
                      {"deflate_slow", 3, false},
                      {"deflate", -1, false},
                      {"inflate_fast", 4, false},
                      {"EVP_EncryptUpdate", -1, true},
                      {"tail_helper", 5, false},
                      {"memcpy", -1, false}}),
            (std::set<std::string>{"SSL_new", "EVP_EncryptUpdate"}));
}

// The cold parts sit first (.text.unlikely), away from their objects; a
// global's part (SSL_read.cold) is a local of the global's object.
TEST(ObjectLayoutTest, ColdPartsFollowTheirParents) {
  std::vector<LinkedFunction> fs;
  fs.push_back({0x100, 0x10, "getrn.cold", 7, false});
  fs.push_back({0x110, 0x10, "main.cold", 0, false});
  fs.push_back({0x120, 0x10, "SSL_read.cold", 2, false});
  fs.push_back({0x200, 0x10, "main", -1, false});
  fs.push_back({0x300, 0x10, "EVP_x", -1, true});
  fs.push_back({0x310, 0x10, "getrn", 7, false});
  fs.push_back({0x320, 0x10, "SSL_read", -1, true});
  SelectWholeObjects(fs);
  std::set<std::string> got;
  for (const auto& f : fs) {
    if (f.selected) got.insert(std::string(f.name));
  }
  EXPECT_EQ(got, (std::set<std::string>{"getrn.cold", "SSL_read.cold", "EVP_x", "getrn", "SSL_read"}));
}

TEST(ObjectLayoutTest, NothingSelectedSelectsNothing) {
  EXPECT_TRUE(Selected({{"a", 0, false}, {"b", -1, false}, {"c", 0, false}}).empty());
  EXPECT_TRUE(Selected({}).empty());
}

// The STT_FILE name of every local function of `path`'s .symtab: the object
// each came from, read here with libelf on its own (the truth of the test).
std::map<std::string, std::string> LocalObjects(const std::string& path) {
  std::map<std::string, std::string> out;
  elf_version(EV_CURRENT);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  for (Elf_Scn* scn = elf ? elf_nextscn(elf, nullptr) : nullptr; scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_SYMTAB) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    std::string file;
    for (size_t i = 1; data != nullptr && i < shdr.sh_size / shdr.sh_entsize; ++i) {
      GElf_Sym sym;
      if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) break;
      const char* name = elf_strptr(elf, shdr.sh_link, sym.st_name);
      if (GELF_ST_TYPE(sym.st_info) == STT_FILE) file = name ? name : "";
      if (GELF_ST_TYPE(sym.st_info) == STT_FUNC && GELF_ST_BIND(sym.st_info) == STB_LOCAL && name) out[name] = file;
    }
  }
  if (elf) elf_end(elf);
  close(fd);
  return out;
}

// A real static link of Debian's libcrypto.a and libssl.a, with the program's
// own objects before the library, between libssl.a and libcrypto.a (two
// objects), and after it. Debian's build names each library object
// libcrypto-lib-*.o / libssl-lib-*.o / libdefault-lib-*.o / libcommon-lib-*.o
// in STT_FILE, which tells which locals the layout may select.
TEST(ObjectLayoutTest, StaticLibcryptoKeepsItsHelpersAndNotTheProgram) {
  const char* kCrypto = "/usr/lib/x86_64-linux-gnu/libcrypto.a";
  const char* kSsl = "/usr/lib/x86_64-linux-gnu/libssl.a";
  ASSERT_TRUE(std::ifstream(kCrypto) && std::ifstream(kSsl)) << "needs libssl-dev (scripts/install-deps.sh)";
  TempDir dir;
  std::ofstream(dir.File("main.c")) << R"(
#include <openssl/evp.h>
#include <openssl/ssl.h>
int mid_one(int), mid_two(int), tail_fn(int);
static int program_helper(int x) { return x * 3 + 1; }
int main(int argc, char** argv) {
  (void)argv;
  unsigned char key[32] = {0}, md[32]; unsigned int n = 0;
  EVP_Digest(key, sizeof key, md, &n, EVP_sha256(), NULL);
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX_free(ctx);
  return program_helper(argc) + mid_one(argc) + mid_two(argc) + tail_fn(argc) + (n == 32 ? 0 : 1);
})";
  std::ofstream(dir.File("mid1.c")) << "static int mid_a(int x) { return x ^ 5; }\n"
                                       "int mid_one(int x) { return mid_a(x) + 1; }\n";
  std::ofstream(dir.File("mid2.c")) << "static int mid_b(int x) { return x ^ 7; }\n"
                                       "int mid_two(int x) { return mid_b(x) + 2; }\n";
  std::ofstream(dir.File("tail.c")) << "static int tail_a(int x) { return x ^ 9; }\n"
                                       "int tail_fn(int x) { return tail_a(x) + 3; }\n";
  auto r = RunCommand("cd " + dir.path() + " && cc -O2 -fno-inline -c main.c mid1.c mid2.c tail.c && cc -o p main.o " +
                      kSsl + " mid1.o mid2.o " + kCrypto + " tail.o -lpthread -ldl");
  ASSERT_EQ(r.status, 0) << r.output;

  LoadOptions by_name;
  by_name.keep = classify::IsTlsSymbol;  // the agent's name test
  LoadOptions whole = by_name;
  whole.keep_whole_objects = true;
  auto named = symtest::LoadPath(dir.File("p"), by_name);
  auto layout = symtest::LoadPath(dir.File("p"), whole);
  ASSERT_TRUE(named && layout);
  const auto objects = LocalObjects(dir.File("p"));
  ASSERT_GT(objects.size(), 1000u);

  // Helpers the name test misses (all seen in profiles of real operations).
  for (const char* helper : {"getrn", "bn2binpad", "copy_conditional", "do_name"}) {
    EXPECT_EQ(symtest::SymbolNamed(**named, helper), nullptr) << helper;
    EXPECT_NE(symtest::SymbolNamed(**layout, helper), nullptr) << helper << " is in " << objects.at(helper);
  }
  // Every local the layout added is from a library object; none of the
  // program's functions, before, between or after, is added.
  size_t added = 0;
  for (const Symbol& s : (*layout)->symbols.all()) {
    if (symtest::SymbolNamed(**named, s.name) != nullptr) continue;
    ++added;
    auto it = objects.find(s.name);
    if (it == objects.end()) continue;  // a global
    const std::string& o = it->second;
    EXPECT_TRUE(o.starts_with("libcrypto-") || o.starts_with("libssl-") || o.starts_with("libdefault-") ||
                o.starts_with("libcommon-"))
        << s.name << " from " << o;
  }
  for (const char* own : {"main", "program_helper", "mid_one", "mid_a", "mid_two", "mid_b", "tail_fn", "tail_a"}) {
    EXPECT_EQ(symtest::SymbolNamed(**layout, own), nullptr) << own;
  }
  EXPECT_GT(added, 100u);
  std::printf("static link: %zu functions kept by name, %zu more by object layout\n", (*named)->symbols.all().size(),
              added);
}

}  // namespace
}  // namespace tlsprof::symbols
