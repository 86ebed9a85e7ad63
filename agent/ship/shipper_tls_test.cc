// The Shipper's mTLS path against an in-process collector that requires and
// verifies client certificates. The PKI is made by the openssl CLI per run.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "agent/ship/shipper.h"
#include "agent/ship/test_collector.h"

namespace tlsprof::ship {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// Runs a shell command in `dir`; its output goes to dir/openssl.log.
bool Run(const std::string& dir, const std::string& command) {
  std::string full = "cd '" + dir + "' && (" + command + ") >>openssl.log 2>&1";
  return std::system(full.c_str()) == 0;
}

// Makes CA `ca` and a leaf `name` signed by it, with extensions `ext`.
bool MakeCa(const std::string& dir, const std::string& ca) {
  return Run(dir, "openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + ca +
                      ".key -out " + ca + ".pem -days 2 -subj /CN=" + ca);
}
bool MakeLeaf(const std::string& dir, const std::string& ca, const std::string& name, const std::string& ext) {
  std::ofstream(dir + "/" + name + ".ext") << ext << "\n";
  return Run(dir, "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + name +
                      ".key -out " + name + ".csr -subj /CN=" + name) &&
         Run(dir, "openssl x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca + ".key -CAcreateserial" +
                      " -days 2 -out " + name + ".pem -extfile " + name + ".ext");
}

class ShipperTlsTest : public ::testing::Test {
 protected:
  // One PKI for the suite: making it is most of the suite's time.
  static void SetUpTestSuite() {
    pki_dir_ = new TempDir();
    const std::string& pki = pki_dir_->path();
    if (std::system("openssl version >/dev/null 2>&1") != 0) {
      pki_error_ = "the openssl CLI is needed to make the test PKI (apt-get install openssl)";
    } else if (!MakeCa(pki, "ca") || !MakeCa(pki, "other-ca") ||
               !MakeLeaf(pki, "ca", "collector", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth") ||
               !MakeLeaf(pki, "ca", "misnamed", "subjectAltName=DNS:elsewhere.example\nextendedKeyUsage=serverAuth") ||
               !MakeLeaf(pki, "ca", "named", "subjectAltName=DNS:collectors.test\nextendedKeyUsage=serverAuth") ||
               !MakeLeaf(pki, "ca", "agent-1", "extendedKeyUsage=clientAuth") ||
               !MakeLeaf(pki, "other-ca", "intruder", "extendedKeyUsage=clientAuth")) {
      pki_error_ = "openssl failed: " + Slurp(pki + "/openssl.log");
    }
  }
  static void TearDownTestSuite() {
    delete pki_dir_;
    pki_dir_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(pki_error_.empty()) << pki_error_;  // fails loudly, never skips
    pki_ = pki_dir_->path();
    ServeAs("collector");
  }

  // The in-process collector, presenting the certificate `leaf`.
  void ServeAs(const std::string& leaf) {
    server_.reset();
    grpc::SslServerCredentialsOptions tls(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    tls.pem_root_certs = Slurp(pki_ + "/ca.pem");
    tls.pem_key_cert_pairs.push_back({Slurp(pki_ + "/" + leaf + ".key"), Slurp(pki_ + "/" + leaf + ".pem")});
    server_ = std::make_unique<TestServer>(&collector_, 0, grpc::SslServerCredentials(tls));
    ASSERT_TRUE(server_->ok());
  }

  ShipperOptions Options(const std::string& ca, const std::string& leaf) {
    ShipperOptions o;
    o.collectors = {server_->address()};
    o.state_dir = state_.path();
    o.tls = {pki_ + "/" + ca + ".pem", pki_ + "/" + leaf + ".pem", pki_ + "/" + leaf + ".key"};
    o.rpc_timeout = 2s;
    o.backoff_min = 10ms;
    o.backoff_max = 50ms;
    return o;
  }

  // A shipper trusting `ca` and presenting `leaf`, with one batch sealed.
  void StartAndSealOne(const std::string& ca, const std::string& leaf) {
    auto shipper = Shipper::Start(Options(ca, leaf));
    ASSERT_TRUE(shipper.ok()) << shipper.error().message;
    shipper_ = std::move(*shipper);
    ASSERT_TRUE(shipper_->Seal(MakeReport(kT0, 10, 1)).ok());
  }

  // The handshakes fail as send errors: the collector sees no call and the
  // batch stays in the spool.
  void ExpectHandshakesFail() {
    ASSERT_TRUE(WaitFor([&] { return shipper_->stats().send_errors >= 2; }, 5s));
    EXPECT_EQ(collector_.calls(), 0u);
    EXPECT_EQ(shipper_->stats().spooled_batches, 1u);
  }

  static inline TempDir* pki_dir_ = nullptr;
  static inline std::string pki_error_;
  static std::string TempDirPath(const TempDir& d) { return d.path(); }
  TempDir state_, state2_;
  std::string pki_;
  TestCollector collector_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Shipper> shipper_;  // stopped before the server
};

TEST_F(ShipperTlsTest, MutualTlsDelivers) {
  ASSERT_NO_FATAL_FAILURE(StartAndSealOne("ca", "agent-1"));
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{1});
  EXPECT_EQ(collector_.peer_common_names(), std::vector<std::string>{"agent-1"});
  EXPECT_EQ(shipper_->stats().send_errors, 0u);
}

// A name with several addresses: one collector per address, dialled by
// address, and the certificate must still hold the name. 127.0.0.2 has no
// collector (refused: the agent fails over if it is its first choice).
TEST_F(ShipperTlsTest, ANameWithSeveralAddressesIsCheckedForTheName) {
  ServeAs("named");
  ShipperOptions o = Options("ca", "agent-1");
  o.collectors = {"collectors.test:" + std::to_string(server_->port())};
  o.resolver = [](const std::string& host) {
    return host == "collectors.test" ? std::vector<std::string>{"127.0.0.2", "127.0.0.1"} : std::vector<std::string>{};
  };
  auto shipper = Shipper::Start(o);
  ASSERT_TRUE(shipper.ok()) << shipper.error().message;
  shipper_ = std::move(*shipper);
  ASSERT_TRUE(shipper_->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(shipper_->Flush(5s));
  EXPECT_EQ(collector_.accepted_sequences(), std::vector<uint64_t>{1});
  EXPECT_EQ(shipper_->stats().collector, "ipv4:127.0.0.1:" + std::to_string(server_->port()));
  shipper_.reset();

  // The same addresses behind a certificate for another name: refused.
  ServeAs("misnamed");
  o.state_dir = TempDirPath(state2_);
  o.collectors = {"collectors.test:" + std::to_string(server_->port())};
  shipper = Shipper::Start(o);
  ASSERT_TRUE(shipper.ok()) << shipper.error().message;
  shipper_ = std::move(*shipper);
  ASSERT_TRUE(shipper_->Seal(MakeReport(kT0, 10, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().send_errors >= 2; }, 5s));
  EXPECT_EQ(collector_.calls(), 1u) << "the first part's call only";
  EXPECT_EQ(shipper_->stats().spooled_batches, 1u);
}

TEST_F(ShipperTlsTest, ACollectorCertificateForAnotherHostIsRefused) {
  // Signed by the trusted CA, but for elsewhere.example, not the address dialled.
  ASSERT_NO_FATAL_FAILURE(ServeAs("misnamed"));
  ASSERT_NO_FATAL_FAILURE(StartAndSealOne("ca", "agent-1"));
  ASSERT_NO_FATAL_FAILURE(ExpectHandshakesFail());
}

TEST_F(ShipperTlsTest, WrongCaFailsTheHandshakeAsASendError) {
  // The agent does not trust the collector's certificate.
  ASSERT_NO_FATAL_FAILURE(StartAndSealOne("other-ca", "agent-1"));
  ASSERT_NO_FATAL_FAILURE(ExpectHandshakesFail());
  EXPECT_FALSE(shipper_->Flush(50ms));
  EXPECT_EQ(shipper_->stats().accepted, 0u);
}

TEST_F(ShipperTlsTest, ClientCertificateFromAnotherCaIsRefused) {
  // The agent trusts the collector, but the collector does not trust it.
  ASSERT_NO_FATAL_FAILURE(StartAndSealOne("ca", "intruder"));
  ASSERT_NO_FATAL_FAILURE(ExpectHandshakesFail());
}

TEST_F(ShipperTlsTest, StartNamesTheBadFile) {
  ShipperOptions o = Options("ca", "agent-1");
  o.tls.ca = pki_ + "/absent.pem";
  auto missing = Shipper::Start(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(o.tls.ca), std::string::npos) << missing.error().message;

  o = Options("ca", "agent-1");
  o.tls.cert = pki_ + "/agent-1.ext";  // not PEM
  auto not_pem = Shipper::Start(o);
  ASSERT_FALSE(not_pem.ok());
  EXPECT_NE(not_pem.error().message.find(o.tls.cert), std::string::npos) << not_pem.error().message;
  EXPECT_NE(not_pem.error().message.find("not PEM"), std::string::npos) << not_pem.error().message;

  o = Options("ca", "agent-1");
  o.tls.key = pki_ + "/intruder.key";  // a key, but not this certificate's
  auto mismatch = Shipper::Start(o);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message.find(o.tls.key), std::string::npos) << mismatch.error().message;

  o = Options("ca", "agent-1");
  o.tls.ca = pki_ + "/agent-1.key";  // PEM, but no certificate in it
  auto no_cert = Shipper::Start(o);
  ASSERT_FALSE(no_cert.ok());
  EXPECT_NE(no_cert.error().message.find(o.tls.ca), std::string::npos) << no_cert.error().message;

  o = Options("ca", "agent-1");
  o.tls = {};
  auto none = Shipper::Start(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("insecure"), std::string::npos) << none.error().message;
}

}  // namespace
}  // namespace tlsprof::ship
