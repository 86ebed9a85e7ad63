/* tlsprof-tls-tick: a small, mostly idle TLS process for the agent's bounds
 * test and bench/churn.py. It maps Debian's libcrypto.so.3 and hashes a
 * buffer with SHA-256 every --period-ms, so that 1,000 of them are 1,000
 * distinct TLS processes that each take a little crypto CPU, for a few
 * hundred kilobytes of private memory each.
 *
 *   tlsprof-tls-tick [--period-ms 50] [--work 40] [--lifetime-ms 0] [--ready-file F]
 *
 * --work: SHA-256 updates of 4 KiB per tick. --lifetime-ms: exit after this
 * long (0: until SIGTERM). The ready file is written (atomically) once the
 * first tick is done.
 */
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int write_ready(const char* path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "w");
  if (f == NULL) return -1;
  fprintf(f, "ready\n");
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

int main(int argc, char** argv) {
  long period_ms = 50, work = 40, lifetime_ms = 0;
  const char* ready = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--period-ms") == 0) {
      period_ms = atol(argv[i + 1]);
    } else if (strcmp(argv[i], "--work") == 0) {
      work = atol(argv[i + 1]);
    } else if (strcmp(argv[i], "--lifetime-ms") == 0) {
      lifetime_ms = atol(argv[i + 1]);
    } else if (strcmp(argv[i], "--ready-file") == 0) {
      ready = argv[i + 1];
    } else {
      fprintf(stderr, "tlsprof-tls-tick: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  static unsigned char buf[4096];
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const double start = now_ms();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == NULL) return 1;
  for (long tick = 0; !g_stop; ++tick) {
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (long i = 0; i < work; ++i) EVP_DigestUpdate(ctx, buf, sizeof buf);
    EVP_DigestFinal_ex(ctx, digest, &len);
    buf[tick % sizeof buf] ^= digest[0];
    if (tick == 0 && ready != NULL && write_ready(ready) != 0) {
      perror("tlsprof-tls-tick: ready file");
      return 1;
    }
    if (lifetime_ms > 0 && now_ms() - start >= (double)lifetime_ms) break;
    struct timespec pause = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
  }
  EVP_MD_CTX_free(ctx);
  return 0;
}
