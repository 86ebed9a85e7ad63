/* tlsprof-churn-child: one short-lived TLS process of tlsprof-churn (main.cc).
 * Static (libc and libcrypto.a): an exec costs ~4 ms of CPU on the project's
 * nested VMs, against ~12 ms with Debian's dynamic libcrypto.so.3 (its
 * relocations), and 200 execs/s must fit beside the rest on 2 vCPUs.
 *
 * Usage: tlsprof-churn-child WORK_MS LINGER_MS REPORT_FD
 * Hashes 16 KiB buffers with SHA-256 (the low-level API: straight to the
 * assembly, no provider start-up) until WORK_MS of thread CPU, writes that CPU
 * (int64 ns) to REPORT_FD (-1: nowhere), sleeps LINGER_MS, exits 0. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int64_t ThreadCpuNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* An OpenSSL 3 marker the agent detects the library by (classify.cc,
 * kOpenSsl3Markers): the hashing alone would not link one in. */
void* volatile tlsprof_churn_marker;

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  tlsprof_churn_marker = (void*)&OSSL_LIB_CTX_new;
  const double work_ms = atof(argv[1]), linger_ms = atof(argv[2]);
  const int report_fd = atoi(argv[3]);
  static unsigned char buf[16384];
  unsigned char md[SHA256_DIGEST_LENGTH] = {0};
  const int64_t start = ThreadCpuNs(), budget = (int64_t)(work_ms * 1e6);
  int64_t used = 0;
  while (used < budget) {
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, buf, sizeof buf);
    SHA256_Final(md, &ctx);
    buf[0] = md[0];
    used = ThreadCpuNs() - start;
  }
  if (report_fd >= 0) {
    if (write(report_fd, &used, sizeof used) != sizeof used) return 1;
    close(report_fd);
  }
  if (linger_ms > 0) {
    const struct timespec ts = {(time_t)(linger_ms / 1000), (long)(fmod(linger_ms, 1000.0) * 1e6)};
    nanosleep(&ts, NULL);
  }
  return 0;
}
