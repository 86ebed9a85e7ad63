/* A provider the way OpenSSL 3 lays one out (core_dispatch.h): static
 * OSSL_ALGORITHM arrays (OSSL_ALGORITHM_CAPABLE for ciphers), each entry's
 * OSSL_DISPATCH array of { function id, function }, static functions.
 * Built and stripped by agent/symbols/library_tables_test.cc (which says what
 * each function must be named) and by tests/fuzz/make_corpus.py (a seed of
 * elf_symbols). */
typedef void (*fn)(void);
typedef struct {
  int id;
  fn function;
} DISPATCH;
typedef struct {
  const char *names, *props;
  const DISPATCH *impl;
  const char *desc;
} ALG;
typedef struct {
  ALG alg;
  int (*capable)(void);
} ALG_CAPABLE;
volatile int sink;
/* Distinct bodies, so no two are folded into one. */
static void __attribute__((noinline)) sha_newctx(void) { sink = 1; }
static void __attribute__((noinline)) sha1_update(void) { sink = 2; }
static void __attribute__((noinline)) sha256_update(void) { sink = 3; }
static void __attribute__((noinline)) sha256_final(void) { sink = 4; }
static void __attribute__((noinline)) aes128gcm_newctx(void) { sink = 5; }
static void __attribute__((noinline)) aes256gcm_newctx(void) { sink = 6; }
static void __attribute__((noinline)) aria128gcm_newctx(void) { sink = 7; }
static void __attribute__((noinline)) gcm_update(void) { sink = 8; }
static void __attribute__((noinline)) ecdsa_newctx(void) { sink = 9; }
static void __attribute__((noinline)) ecdsa_sign(void) { sink = 10; }
static void __attribute__((noinline)) rsa_sign(void) { sink = 11; }
static void __attribute__((noinline)) rsa_encoder(void) { sink = 12; }
static const DISPATCH sha1_d[] = {{1, sha_newctx}, {3, sha1_update}, {0, 0}};
static const DISPATCH sha256_d[] = {{1, sha_newctx}, {3, sha256_update}, {4, sha256_final}, {0, 0}};
static const ALG digests[] = {{"SHA1:SHA-1:1.3.14.3.2.26", "provider=default", sha1_d, 0},
                              {"SHA2-256:SHA-256", "provider=default", sha256_d, "SHA-256"},
                              {0, 0, 0, 0}};
static const DISPATCH aes128_d[] = {{1, aes128gcm_newctx}, {4, gcm_update}, {6, gcm_update}, {0, 0}};
static const DISPATCH aes256_d[] = {{1, aes256gcm_newctx}, {4, gcm_update}, {6, gcm_update}, {0, 0}};
static const DISPATCH aria_d[] = {{1, aria128gcm_newctx}, {4, gcm_update}, {0, 0}};
static const ALG_CAPABLE ciphers[] = {{{"AES-128-GCM:id-aes128-GCM", "provider=default", aes128_d, 0}, 0},
                                      {{"AES-256-GCM:id-aes256-GCM", "provider=default", aes256_d, 0}, 0},
                                      {{"ARIA-128-GCM", "provider=default", aria_d, 0}, 0},
                                      {{0, 0, 0, 0}, 0}};
static const DISPATCH ecdsa_d[] = {{1, ecdsa_newctx}, {3, ecdsa_sign}, {0, 0}};
static const DISPATCH rsa_d[] = {{3, rsa_sign}, {0, 0}};
static const ALG signatures[] = {
    {"ECDSA", "provider=default", ecdsa_d, 0}, {"RSA:rsaEncryption", "provider=default", rsa_d, 0}, {0, 0, 0, 0}};
static const DISPATCH enc_d[] = {{1, rsa_encoder}, {0, 0}};
static const ALG encoders[] = {{"RSA:rsaEncryption", "provider=default,output=der", enc_d, 0}, {0, 0, 0, 0}};
/* The provider's query function: the only export. */
const void *provider_query(int operation) {
  switch (operation) {
    case 1:
      return digests;
    case 2:
      return ciphers;
    case 12:
      return signatures;
    case 20:
      return encoders;
  }
  return 0;
}
