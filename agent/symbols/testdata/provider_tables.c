/* A provider the way OpenSSL 3 lays one out (core_dispatch.h): static
 * OSSL_ALGORITHM arrays (OSSL_ALGORITHM_CAPABLE for ciphers), each entry's
 * OSSL_DISPATCH array of { function id, function }, static functions.
 * Built and stripped by agent/symbols/library_tables_test.cc (which says what
 * each function must be named) and by tests/fuzz/make_corpus.py (a seed of
 * elf_symbols). */
typedef void (*fn)(void);
typedef struct { int id; fn function; } DISPATCH;
typedef struct { const char *names, *props; const DISPATCH *impl; const char *desc; } ALG;
typedef struct { ALG alg; int (*capable)(void); } ALG_CAPABLE;
volatile int sink;
#define F(name, k) static void __attribute__((noinline)) name(void) { sink = k; }
F(sha_newctx, 1) F(sha1_update, 2) F(sha256_update, 3) F(sha256_final, 4)
F(aes128gcm_newctx, 5) F(aes256gcm_newctx, 6) F(aria128gcm_newctx, 7) F(gcm_update, 8)
F(ecdsa_newctx, 9) F(ecdsa_sign, 10) F(rsa_sign, 11) F(rsa_encoder, 12)
static const DISPATCH sha1_d[] = {{1, sha_newctx}, {3, sha1_update}, {0, 0}};
static const DISPATCH sha256_d[] = {{1, sha_newctx}, {3, sha256_update}, {4, sha256_final}, {0, 0}};
static const ALG digests[] = {{"SHA1:SHA-1:1.3.14.3.2.26", "provider=default", sha1_d, 0},
                              {"SHA2-256:SHA-256", "provider=default", sha256_d, "SHA-256"}, {0, 0, 0, 0}};
static const DISPATCH aes128_d[] = {{1, aes128gcm_newctx}, {4, gcm_update}, {6, gcm_update}, {0, 0}};
static const DISPATCH aes256_d[] = {{1, aes256gcm_newctx}, {4, gcm_update}, {6, gcm_update}, {0, 0}};
static const DISPATCH aria_d[] = {{1, aria128gcm_newctx}, {4, gcm_update}, {0, 0}};
static const ALG_CAPABLE ciphers[] = {{{"AES-128-GCM:id-aes128-GCM", "provider=default", aes128_d, 0}, 0},
                                      {{"AES-256-GCM:id-aes256-GCM", "provider=default", aes256_d, 0}, 0},
                                      {{"ARIA-128-GCM", "provider=default", aria_d, 0}, 0},
                                      {{0, 0, 0, 0}, 0}};
static const DISPATCH ecdsa_d[] = {{1, ecdsa_newctx}, {3, ecdsa_sign}, {0, 0}};
static const DISPATCH rsa_d[] = {{3, rsa_sign}, {0, 0}};
static const ALG signatures[] = {{"ECDSA", "provider=default", ecdsa_d, 0},
                                 {"RSA:rsaEncryption", "provider=default", rsa_d, 0}, {0, 0, 0, 0}};
static const DISPATCH enc_d[] = {{1, rsa_encoder}, {0, 0}};
static const ALG encoders[] = {{"RSA:rsaEncryption", "provider=default,output=der", enc_d, 0}, {0, 0, 0, 0}};
/* The provider's query function: the only export. */
const void* provider_query(int operation) {
  switch (operation) {
    case 1: return digests;
    case 2: return ciphers;
    case 12: return signatures;
    case 20: return encoders;
  }
  return 0;
}
