// SPDX-License-Identifier: Apache-2.0
// Real TLS handshakes against the manager's gRPC server, with certificates made by the openssl
// command line for each run: what a client made by MakeChannel accepts and what it refuses.
#include <fstream>

#include <gtest/gtest.h>
#include <httplib.h>

#include "common/credential.h"
#include "common/grpc_settings.h"
#include "manager/service.h"
#include "manager/test_certificates.h"

namespace regroup::manager {
namespace {

using namespace std::chrono_literals;

using ::regroup::testing::Certificates;

constexpr char kCredential[] = "tls-secret";
constexpr const char* kServerName = Certificates::kServerName;

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new Certificates; }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(certs_->ok()) << "openssl failed: see " << certs_->Path("openssl.log");
  }

  // A one-pod manager serving TLS with the certificate `name` (.crt and .key).
  // With `client_ca`, mutual TLS: clients need a certificate that CA signed.
  std::unique_ptr<ManagerServer> StartManager(const std::string& name,
                                              const std::string& http = "",
                                              const std::string& client_ca = "") {
    JobSpec spec;
    spec.id = "default/tls";
    spec.pods = 1;
    spec.processes_per_pod = 1;
    auto resolved = spec.Resolve();
    JobControlOptions ro;
    ro.epoch = 7;
    auto job = std::make_unique<JobControl>(spec, resolved.config, ro,
                                            std::make_unique<EmbeddedDecisions>(spec));
    ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.credential = kCredential;
    so.tls_cert_file = certs_->Path(name + ".crt");
    so.tls_key_file = certs_->Path(name + ".key");
    so.http_listen = http;
    if (!client_ca.empty()) so.tls_client_ca_file = certs_->Path(client_ca);
    so.tick = 5ms;
    auto server = std::make_unique<ManagerServer>(std::move(job), so);
    Status st = server->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return server;
  }

  // GetStatus over a channel trusting `ca` (a file of the run), checking `server_name`, and
  // presenting the client certificate `client` (.crt and .key) when given.
  static grpc::Status AskStatus(int port, const std::string& ca,
                                const std::string& server_name = "",
                                const std::string& client = "") {
    ClientTls tls{certs_->Path(ca), server_name};
    if (!client.empty()) {
      tls.cert_file = certs_->Path(client + ".crt");
      tls.key_file = certs_->Path(client + ".key");
    }
    auto channel = MakeChannel("127.0.0.1:" + std::to_string(port), tls);
    EXPECT_TRUE(channel.ok()) << channel.status().message();
    if (!channel.ok()) return {grpc::StatusCode::INTERNAL, channel.status().message()};
    auto stub = v1::Manager::NewStub(*channel);
    grpc::ClientContext context;
    AttachCredential(context, kCredential);
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::GetStatusResponse response;
    grpc::Status st = stub->GetStatus(&context, {}, &response);
    if (st.ok()) {
      EXPECT_EQ(response.job_id(), "default/tls");
    }
    return st;
  }

  static Certificates* certs_;
};

Certificates* Tls::certs_ = nullptr;

// A refused handshake: the call fails as unreachable, and the manager never saw it.
void ExpectRefused(const grpc::Status& st) {
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
}

TEST_F(Tls, AGoodCertificateConnectsAndAnAgentRegistersOverIt) {
  auto server = StartManager("ip");
  EXPECT_TRUE(AskStatus(server->port(), "ca.crt").ok());

  // An agent's stream, as the agent opens it: register, be welcomed, get the generation.
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(server->port()),
                             {certs_->Path("ca.crt"), ""});
  ASSERT_TRUE(channel.ok()) << channel.status().message();
  auto stub = v1::Manager::NewStub(*channel);
  grpc::ClientContext context;
  AttachCredential(context, kCredential);
  auto stream = stub->Session(&context);
  v1::AgentMessage hello;
  hello.mutable_header()->set_job_id("default/tls");
  hello.mutable_header()->set_sender("pod-0");
  auto* reg = hello.mutable_register_();
  reg->set_pod_uid("pod-0");
  reg->set_node_rank(0);
  reg->set_nproc(1);
  reg->set_host("127.0.0.1");
  reg->set_free_port(40000);
  reg->add_ranks()->set_alive(true);
  reg->mutable_ranks(0)->set_phase(v1::PHASE_PAUSED);
  ASSERT_TRUE(stream->Write(hello));
  v1::ManagerMessage m;
  bool started = false;
  while (!started && stream->Read(&m)) started = m.has_start();
  ASSERT_TRUE(started) << stream->Finish().error_message();
  EXPECT_EQ(m.start().plan().world_size(), 1u);
  context.TryCancel();
  server->Stop();
}

// Issue 12: /status and /metrics need the credential off loopback; with a certificate they are
// HTTPS, so the credential never crosses the network in clear.
TEST_F(Tls, WithACertificateHttpIsHttpsAndTheCredentialNeverCrossesInClear) {
  auto server = StartManager("ip", "0.0.0.0:0");
  const int port = server->http_port();
  ASSERT_GT(port, 0);
  httplib::SSLClient https("127.0.0.1", port);
  https.set_ca_cert_path(certs_->Path("ca.crt").c_str());
  https.enable_server_certificate_verification(true);
  https.set_connection_timeout(5);
  auto res = https.Get("/status", {{"Authorization", std::string("Bearer ") + kCredential}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("default/tls"), std::string::npos);
  res = https.Get("/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401) << "still needs the credential";
  httplib::Client plain("127.0.0.1", port);
  plain.set_connection_timeout(5);
  plain.set_read_timeout(5);
  auto cleartext = plain.Get("/status", {{"Authorization", std::string("Bearer ") + kCredential}});
  EXPECT_FALSE(cleartext && cleartext->status == 200) << "plain HTTP must not be answered";
  server->Stop();
}

// Mutual TLS on HTTPS: with --tls-client-ca, /status and /metrics off loopback need a client
// certificate the CA signed besides the credential; a certificate another CA signed fails the
// handshake; the kubelet's probes, which present none, still get /healthz and /readyz.
TEST_F(Tls, WithAClientCaHttpsNeedsAClientCertificateButTheProbesDoNot) {
  auto server = StartManager("ip", "0.0.0.0:0", "ca.crt");
  const int port = server->http_port();
  ASSERT_GT(port, 0);
  const std::string bearer = std::string("Bearer ") + kCredential;
  // GET `path` presenting the client certificate `client` (none for ""), with the credential
  // when `token`.
  auto get = [&](const std::string& client, const std::string& path, bool token) {
    auto https = client.empty()
                     ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
                     : std::make_unique<httplib::SSLClient>("127.0.0.1", port,
                                                            certs_->Path(client + ".crt"),
                                                            certs_->Path(client + ".key"));
    https->set_ca_cert_path(certs_->Path("ca.crt").c_str());
    https->enable_server_certificate_verification(true);
    https->set_connection_timeout(5);
    https->set_read_timeout(5);
    httplib::Headers headers;
    if (token) headers.emplace("Authorization", bearer);
    return https->Get(path, headers);
  };
  for (const char* path : {"/status", "/metrics"}) {
    auto res = get("named", path, true);
    ASSERT_TRUE(res) << path << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200) << path << ": " << res->body;
    res = get("", path, true);
    ASSERT_TRUE(res) << path << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 403) << path << ": the credential alone is not enough";
    EXPECT_NE(res->body.find("no client certificate"), std::string::npos) << res->body;
    res = get("named", path, false);
    ASSERT_TRUE(res) << path << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 401) << path << ": the certificate alone is not enough";
    res = get("stranger", path, true);
    EXPECT_FALSE(res && res->status == 200) << path << ": another CA's certificate was served";
  }
  auto res = get("", "/healthz", false);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200) << "a probe presents no certificate";
  server->Stop();
}

TEST_F(Tls, ACertificateFromAnotherCaIsRefused) {
  auto server = StartManager("stranger");
  ExpectRefused(AskStatus(server->port(), "ca.crt"));
  server->Stop();
}

// Issue 40, finding 9: a client said only that nobody answered. A failed handshake is named as
// such, with the peer and gRPC's reason (regroupctl status and the agent use these words).
TEST_F(Tls, AFailedHandshakeIsNamedWithThePeerAndTheReason) {
  auto stranger = StartManager("stranger");
  const std::string at = "127.0.0.1:" + std::to_string(stranger->port());
  std::string said = DescribeCallFailure(AskStatus(stranger->port(), "ca.crt"), at);
  EXPECT_NE(said.find("the TLS handshake with " + at + " failed: SSL_ERROR_SSL"),
            std::string::npos) << said;
  EXPECT_NE(said.find("certificate verify failed"), std::string::npos) << said;
  stranger->Stop();
  auto ip = StartManager("ip");
  const std::string ip_at = "127.0.0.1:" + std::to_string(ip->port());
  said = DescribeCallFailure(AskStatus(ip->port(), "ca.crt", "other.default.svc"), ip_at);
  EXPECT_NE(said.find("the TLS handshake with " + ip_at +
                      " failed: Peer name other.default.svc is not in peer certificate"),
            std::string::npos) << said;
  ip->Stop();
  // Nobody listening is not a handshake: gRPC's own words.
  said = DescribeCallFailure(AskStatus(ip->port(), "ca.crt"), ip_at);
  EXPECT_EQ(said.find("TLS handshake"), std::string::npos) << said;
}

// Mutual TLS (issue 40): a manager given a client CA serves only clients presenting a
// certificate that CA signed; its certificates are the same Secret layout as the server's.
TEST_F(Tls, WithAClientCaOnlyClientsWithACertificateItSignedAreServed) {
  auto server = StartManager("ip", "", "ca.crt");
  ExpectRefused(AskStatus(server->port(), "ca.crt"));  // no client certificate
  ExpectRefused(AskStatus(server->port(), "ca.crt", "", "stranger"));  // another CA's
  // Under TLS 1.3 the client's side of the handshake succeeds before the server refuses it: the
  // client sees the connection closed, which a TLS client names as a refused handshake.
  const std::string at = "127.0.0.1:" + std::to_string(server->port());
  const grpc::Status closed = AskStatus(server->port(), "ca.crt");
  std::string said = DescribeCallFailure(closed, at, /*over_tls=*/true);
  EXPECT_NE(said.find("the TLS handshake with " + at +
                      " failed: the server closed the connection as it was made"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("refuses this client's, or gets none"), std::string::npos) << said;
  said = DescribeCallFailure(closed, at);  // a plaintext client: not a handshake
  EXPECT_EQ(said.find("TLS handshake"), std::string::npos) << said;
  const grpc::Status served = AskStatus(server->port(), "ca.crt", "", "named");
  EXPECT_TRUE(served.ok()) << served.error_message();
  server->Stop();
  // Without the client CA, a client certificate is not needed (and harmless).
  auto plain = StartManager("ip");
  EXPECT_TRUE(AskStatus(plain->port(), "ca.crt").ok());
  EXPECT_TRUE(AskStatus(plain->port(), "ca.crt", "", "named").ok());
  plain->Stop();
  // A client certificate with another's key, or without its key, is an error naming the files.
  auto mismatched = MakeChannel("127.0.0.1:1", {certs_->Path("ca.crt"), "",
                                                certs_->Path("named.crt"), certs_->Path("ip.key")});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not match the TLS certificate"),
            std::string::npos)
      << mismatched.status().message();
  auto alone = MakeChannel("127.0.0.1:1", {certs_->Path("ca.crt"), "", certs_->Path("named.crt")});
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("needs both a certificate and a key file"),
            std::string::npos)
      << alone.status().message();
}

TEST_F(Tls, AnExpiredCertificateIsRefused) {
  auto server = StartManager("expired");
  ExpectRefused(AskStatus(server->port(), "ca.crt"));
  server->Stop();
}

TEST_F(Tls, ACertificateForAnotherNameIsRefused) {
  // Reached at 127.0.0.1, a certificate naming only manager.default.svc does not match.
  auto named = StartManager("named");
  ExpectRefused(AskStatus(named->port(), "ca.crt"));
  named->Stop();
  // Nor does an override naming what the certificate does not carry.
  auto ip = StartManager("ip");
  ExpectRefused(AskStatus(ip->port(), "ca.crt", "other.default.svc"));
  ip->Stop();
}

TEST_F(Tls, TheServerNameOverrideMakesTheNameMatch) {
  auto server = StartManager("named");
  EXPECT_TRUE(AskStatus(server->port(), "ca.crt", kServerName).ok());
  server->Stop();
}

TEST_F(Tls, APlaintextClientIsRefused) {
  auto server = StartManager("ip");
  auto stub = v1::Manager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(server->port())).value());
  grpc::ClientContext context;
  AttachCredential(context, kCredential);
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::GetStatusResponse response;
  ExpectRefused(stub->GetStatus(&context, {}, &response));
  server->Stop();
}

// A CA file that cannot serve is an error naming the path, never the system's roots.
// Issue 40, finding 9: a certificate given with another's key was reported as "cannot listen ...
// (in use, or not an address of this host)".
TEST_F(Tls, AKeyThatDoesNotMatchItsCertificateIsNamed) {
  JobSpec spec;
  spec.id = "default/tls";
  spec.pods = 1;
  spec.processes_per_pod = 1;
  auto resolved = spec.Resolve();
  JobControlOptions ro;
  ro.epoch = 7;
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.credential = kCredential;
  so.tls_cert_file = certs_->Path("ip.crt");
  so.tls_key_file = certs_->Path("named.key");
  ManagerServer server(std::make_unique<JobControl>(spec, resolved.config, ro,
                                                    std::make_unique<EmbeddedDecisions>(spec)),
                       so);
  Status st = server.Start();
  EXPECT_EQ(st.message(), "the TLS key " + certs_->Path("named.key") +
                              " does not match the TLS certificate " + certs_->Path("ip.crt"));
}

TEST_F(Tls, ACaFileThatCannotBeUsedIsAnErrorNamingIt) {
  const std::string empty = certs_->Path("empty.crt");
  std::ofstream(empty).close();
  struct Case {
    std::string ca, want;
  };
  for (const Case& c : {Case{certs_->Path("missing.crt"), "cannot read the TLS CA file " +
                                                              certs_->Path("missing.crt")},
                        Case{certs_->Path(""), "is a directory"},
                        Case{empty, "the TLS CA file " + empty + " holds no PEM certificate"},
                        Case{certs_->Path("ca.key"), "holds no PEM certificate"}}) {
    auto channel = MakeChannel("127.0.0.1:1", {c.ca, ""});
    ASSERT_FALSE(channel.ok()) << c.ca;
    EXPECT_NE(channel.status().message().find(c.want), std::string::npos)
        << channel.status().message();
  }
  auto name_only = MakeChannel("127.0.0.1:1", {"", kServerName});
  ASSERT_FALSE(name_only.ok());
  EXPECT_NE(name_only.status().message().find("the TLS server name manager.default.svc needs a CA "
                                              "file"),
            std::string::npos)
      << name_only.status().message();
}

}  // namespace
}  // namespace regroup::manager
