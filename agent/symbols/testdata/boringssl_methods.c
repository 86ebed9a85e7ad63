/* Method structs the way BoringSSL lays them out and reaches them: an
 * EVP_AEAD in .data.rel.ro returned by `lea rax; ret`; an EVP_MD and an
 * EVP_CIPHER in .bss filled by a once-init that the getter hands to
 * CRYPTO_once (BoringSSL's DEFINE_METHOD_FUNCTION); and
 * EC_GROUP_new_by_curve_name, whose once-init fills a built-in curve table
 * { nid, ..., method } with the methods' own once-inits inlined.
 * Built and stripped by agent/symbols/boringssl_tables_test.cc (which says
 * what each function must be named) and by tests/fuzz/make_corpus.py (a seed
 * of elf_symbols). Only the layout matters here, not what the code does. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*fn)(void);
volatile int sink;
/* Distinct bodies, so no two are folded into one. */
#define F(name, n) \
  static void __attribute__((noinline)) name(void) { sink = n; }
F(chacha_init, 1)
F(chacha_cleanup, 2)
F(chacha_seal_scatter, 3)
F(chacha_open_gather, 4)
F(sha256_init, 5)
F(sha256_update, 6)
F(sha256_final, 7)
F(aes_init_key, 8)
F(aes_cbc_cipher, 9)
F(p256_mul, 10)
F(p256_mul_base, 11)
F(mont_group_init, 12)
F(mont_mul, 13)
F(mont_mul_base, 14)

/* Exported, so a library is read as BoringSSL (boringssl_tables.h). */
int BORINGSSL_self_test(void) { return 1; }
void CRYPTO_once(pthread_once_t *once, void (*init)(void)) { pthread_once(once, init); }

/* EVP_AEAD: key_len..max_tag_len, seal_scatter_supports_extra_in, then
 * init, init_with_direction, cleanup, open, seal_scatter, open_gather,
 * get_iv, tag_len. */
struct aead {
  uint8_t key_len, nonce_len, overhead, max_tag_len;
  int extra_in;
  fn init, init_with_direction, cleanup, open, seal_scatter, open_gather, get_iv, tag_len;
};
static const struct aead chacha = {
    32, 12, 16, 16, 1, chacha_init, 0, chacha_cleanup, 0, chacha_seal_scatter, chacha_open_gather, 0, 0};
const struct aead *EVP_aead_chacha20_poly1305(void) { return &chacha; }

/* EVP_MD: type, md_size, flags, init, update, final, block_size, ctx_size. */
struct md {
  int type;
  unsigned md_size;
  uint32_t flags;
  fn init, update, final;
  unsigned block_size, ctx_size;
};
/* EVP_CIPHER: nid, block_size, key_len, iv_len, ctx_size, flags, app_data,
 * init, cipher, cleanup, ctrl. */
struct cipher {
  int nid;
  unsigned block_size, key_len, iv_len, ctx_size;
  uint32_t flags;
  void *app_data;
  fn init, cipher, cleanup, ctrl;
};
/* One pointer per statement, through a volatile store: the compiler keeps
 * scalar stores as BoringSSL's inits have them (no vector pairs). */
#define SET(field, value) (*(fn volatile *)&(field) = (value))

static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static struct md sha256_md;
static void sha256_md_init(void) {
  sha256_md.type = 672;
  sha256_md.md_size = 32;
  SET(sha256_md.init, sha256_init);
  SET(sha256_md.update, sha256_update);
  SET(sha256_md.final, sha256_final);
  sha256_md.block_size = 64;
}
const struct md *EVP_sha256(void) {
  CRYPTO_once(&sha256_once, sha256_md_init);
  return &sha256_md;
}

static pthread_once_t cbc_once = PTHREAD_ONCE_INIT;
static struct cipher cbc;
static void cbc_init(void) {
  cbc.nid = 419;
  cbc.block_size = 16;
  SET(cbc.init, aes_init_key);
  SET(cbc.cipher, aes_cbc_cipher);
}
const struct cipher *EVP_aes_128_cbc(void) {
  CRYPTO_once(&cbc_once, cbc_init);
  return &cbc;
}
const struct cipher *EVP_aes_256_cbc(void) {
  CRYPTO_once(&cbc_once, cbc_init);
  return &cbc;
}

/* EC_METHOD (BoringSSL 2021-2023): group_init at 0, mul at 56, mul_base at 64. */
struct ec_method {
  fn slots[23];
};
static pthread_once_t p256_once = PTHREAD_ONCE_INIT, mont_once = PTHREAD_ONCE_INIT;
static struct ec_method p256_method, mont_method;
static void p256_method_init(void) {
  SET(p256_method.slots[0], mont_group_init);
  SET(p256_method.slots[7], p256_mul);
  SET(p256_method.slots[8], p256_mul_base);
}
static void mont_method_init(void) {
  SET(mont_method.slots[0], mont_group_init);
  SET(mont_method.slots[7], mont_mul);
  SET(mont_method.slots[8], mont_mul_base);
}

struct curve {
  int nid;
  const uint8_t *oid;
  uint8_t oid_len;
  const char *comment;
  uint8_t param_len;
  const uint8_t *params;
  const struct ec_method *method;
};
static const uint8_t kOid[] = {1, 2, 3}, kParams[] = {4, 5, 6};
static pthread_once_t curves_once = PTHREAD_ONCE_INIT;
static struct curve curves[2];
static void curves_init(void) {
  curves[0].nid = 715; /* P-384 */
  curves[0].oid = kOid;
  curves[0].oid_len = 3;
  curves[0].params = kParams;
  CRYPTO_once(&mont_once, mont_method_init);
  curves[0].method = &mont_method;
  curves[1].nid = 415; /* P-256 */
  curves[1].oid = kOid;
  curves[1].oid_len = 3;
  curves[1].params = kParams;
  CRYPTO_once(&p256_once, p256_method_init);
  curves[1].method = &p256_method;
}
const void *EC_GROUP_new_by_curve_name(int nid) {
  CRYPTO_once(&curves_once, curves_init);
  for (size_t i = 0; i < 2; i++) {
    if (curves[i].nid == nid) return curves[i].method;
  }
  return NULL;
}
