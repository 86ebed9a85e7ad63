#include "agent/usage/handshake_cost.h"

#include <map>
#include <tuple>

namespace tlsprof::usage {

namespace {

// A handshake's key exchange cost from its operations' means: the one
// operation of its key type and length; for a hybrid group whose halves ran
// as two operations (Go's ML-KEM-768 and X25519, BoringSSL's Kyber768 and
// X25519: the handshake's ciphertext length is the KEM's plus the ECDH
// share's), the two.
template <typename Lookup>
double KeyExchangeCost(uint32_t tgid, uint32_t type, uint32_t len, const Lookup& lookup) {
  const double whole = lookup(tgid, USAGE_OP_DERIVE, type, len);
  if (whole > 0 || (type != USAGE_KEY_KEM && type != USAGE_KEY_KYBER)) return whole;
  struct Share {
    uint32_t bytes, ecdh_type, secret_len;
  };
  constexpr Share kShares[] = {{32, USAGE_KEY_X25519, 32}, {65, USAGE_KEY_EC, 32}, {97, USAGE_KEY_EC, 48}};
  for (const Share& share : kShares) {
    if (len <= share.bytes) continue;
    const double kem = lookup(tgid, USAGE_OP_DERIVE, type, len - share.bytes);
    const double ecdh = lookup(tgid, USAGE_OP_DERIVE, share.ecdh_type, share.secret_len);
    if (kem > 0 && ecdh > 0) return kem + ecdh;
  }
  return 0;
}

}  // namespace

std::vector<HandshakeCost> SplitHandshakeCpu(const UsageSnapshot& window,
                                             const std::function<double(uint32_t tgid)>& handshake_tls_cpu) {
  // Mean on-CPU seconds of in-handshake operations, by process, operation,
  // key type and length; and each process's verify CPU per full client
  // handshake (a client verifies the chain and the handshake signature).
  using OpKey = std::tuple<uint32_t, uint8_t, uint32_t, uint32_t>;
  std::map<OpKey, double> mean;
  std::map<uint32_t, double> verify_cpu, full_client;
  for (const OperationStats& op : window.operations) {
    if (!op.key.in_handshake || op.count == 0) continue;
    const double cpu = static_cast<double>(op.cpu_ns) / 1e9;
    mean[{op.key.tgid, op.key.op, op.key.key_type, op.key.len}] = cpu / static_cast<double>(op.count);
    if (op.key.op == USAGE_OP_VERIFY) verify_cpu[op.key.tgid] += cpu * (op.estimated / static_cast<double>(op.count));
  }
  for (const HandshakeCount& h : window.handshakes) {
    if (h.key.is_server == 0 && h.key.resumed == 0) full_client[h.key.tgid] += h.estimated;
  }
  auto lookup = [&](uint32_t tgid, uint8_t op, uint32_t type, uint32_t len) {
    auto it = mean.find({tgid, op, type, len});
    return it == mean.end() ? 0.0 : it->second;
  };

  std::vector<double> own(window.handshakes.size(), 0.0);
  std::map<uint32_t, double> own_sum, count;
  for (size_t i = 0; i < window.handshakes.size(); ++i) {
    const HandshakeCount& h = window.handshakes[i];
    double per = 0;
    if (h.key.resumed == 0 && h.key.is_server == 1)
      per += lookup(h.key.tgid, USAGE_OP_SIGN, h.key.cert_type, h.key.sig_len);
    if (h.key.resumed == 0 && h.key.is_server == 0 && full_client[h.key.tgid] > 0) {
      per += verify_cpu[h.key.tgid] / full_client[h.key.tgid];
    }
    if (h.key.kx_type != 0) per += KeyExchangeCost(h.key.tgid, h.key.kx_type, h.key.kx_len, lookup);
    own[i] = per * h.estimated;
    own_sum[h.key.tgid] += own[i];
    count[h.key.tgid] += h.estimated;
  }
  // The rest of each process's handshake CPU, shared equally; if the
  // operations alone exceed what was sampled (sampling noise), they are
  // scaled down to it.
  std::vector<HandshakeCost> out(window.handshakes.size());
  std::map<uint32_t, double> total;
  for (const auto& [tgid, n] : count) total[tgid] = handshake_tls_cpu(tgid);
  for (size_t i = 0; i < window.handshakes.size(); ++i) {
    const HandshakeCount& h = window.handshakes[i];
    const uint32_t tgid = h.key.tgid;
    const double t = total[tgid], s = own_sum[tgid], n = count[tgid];
    if (n <= 0) continue;
    if (s > t) {
      out[i].cpu_seconds = s > 0 ? own[i] * t / s : 0.0;
    } else {
      out[i].cpu_seconds = own[i] + (t - s) * h.estimated / n;
    }
  }
  return out;
}

}  // namespace tlsprof::usage
