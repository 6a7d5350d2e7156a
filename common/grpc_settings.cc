// SPDX-License-Identifier: Apache-2.0
#include "common/grpc_settings.h"

#include <cctype>
#include <string_view>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/files.h"

namespace regroup {

std::string DescribeCallFailure(const grpc::Status& status, const std::string& target,
                                bool over_tls) {
  const std::string& message = status.error_message();
  std::string lower = message;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // A TLS 1.3 server refusing the client's certificate (or its lack of one): the client saw
  // its own side of the handshake succeed, then the connection closed before any answer.
  if (over_tls && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
      lower.find("socket closed") != std::string::npos)
    return "the TLS handshake with " + target +
           " failed: the server closed the connection as it was made (" + message +
           "): a server that requires a client certificate (mutual TLS) does so when it refuses "
           "this client's, or gets none (check that this client presents a certificate, with "
           "its key, that the server's client CA signed)";
  // gRPC's words for a failed handshake ("Ssl handshake failed: SSL_ERROR_SSL: ... certificate
  // verify failed"), and for a certificate without the name expected ("Peer name N is not in
  // peer certificate"), which it checks once the handshake is done.
  constexpr std::string_view kHandshake = "handshake failed";
  size_t at = lower.find(kHandshake);
  std::string reason;
  if (at != std::string::npos) {
    reason = message.substr(at + kHandshake.size());
  } else if (lower.find("is not in peer certificate") != std::string::npos &&
             (at = lower.find("peer name ")) != std::string::npos) {
    reason = message.substr(at);
  } else {
    return message.empty() ? "code " + std::to_string(status.error_code()) : message;
  }
  while (!reason.empty() && (reason.front() == ':' || reason.front() == ' ')) reason.erase(0, 1);
  return "the TLS handshake with " + target + " failed: " +
         (reason.empty() ? std::string("gRPC gave no reason") : reason) +
         " (check that the CA file given holds the CA that signed its certificate, and that the "
         "certificate carries the server name expected)";
}

grpc::Status ToGrpcStatus(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case REGROUP_OK: return grpc::Status::OK;
    case REGROUP_INVALID_ARGUMENT: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case REGROUP_NOT_FOUND: code = grpc::StatusCode::NOT_FOUND; break;
    case REGROUP_FAILED_PRECONDITION: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case REGROUP_RESOURCE_EXHAUSTED: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    default: break;
  }
  return {code, status.message()};
}

void ConfigureServer(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(kClientPingInterval.count() / 2));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // never too_many_pings
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The server pings too, so that a peer that vanished (a paused or partitioned pod, a reset
  // that never reached us) frees its stream within kServerPingInterval + kPingTimeout instead
  // of after TCP's retransmissions (minutes), which would keep its node rank held.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kServerPingInterval.count()));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kPingTimeout.count()));
  // A second server on a port already in use must fail, not share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

namespace {

// The certificate's public key is the key's (issue 40: a mismatch was reported as "cannot
// listen ... in use" once gRPC failed to build the server).
Status KeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem,
                             const std::string& cert_file, const std::string& key_file) {
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  X509* cert = cert_bio ? PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr) : nullptr;
  EVP_PKEY* key = key_bio ? PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr) : nullptr;
  Status out = Status::Ok();
  if (!cert)
    out = InvalidArgument("the TLS certificate " + cert_file + " holds no PEM certificate");
  else if (!key)
    out = InvalidArgument("the TLS key " + key_file + " holds no PEM private key");
  else if (X509_check_private_key(cert, key) != 1)
    out = InvalidArgument("the TLS key " + key_file + " does not match the TLS certificate " +
                          cert_file);
  ERR_clear_error();
  EVP_PKEY_free(key);
  X509_free(cert);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  return out;
}

// A CA bundle: gRPC reads empty roots as "the system's roots", so a CA file emptied by mistake
// would trust every public CA.
StatusOr<std::string> ReadCaFile(const std::string& path) {
  auto ca = ReadSmallFile(path, "TLS CA");
  if (!ca.ok()) return ca.status();
  if (ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos)
    return InvalidArgument("the TLS CA file " + path + " holds no PEM certificate");
  return ca;
}

// A certificate and its key, read and checked against each other.
struct KeyPair {
  std::string cert, key;
};
StatusOr<KeyPair> ReadKeyPair(const std::string& cert_file, const std::string& key_file) {
  auto cert = ReadSmallFile(cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadSmallFile(key_file, "TLS key");
  if (!key.ok()) return key.status();
  REGROUP_RETURN_IF_ERROR(KeyMatchesCertificate(*cert, *key, cert_file, key_file));
  return KeyPair{std::move(*cert), std::move(*key)};
}

}  // namespace

StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                     const ClientTls& tls,
                                                     std::chrono::milliseconds connect_timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kClientPingInterval.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kPingTimeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A restarted manager is found within about half a second of listening (issue 15: agents
  // back within 1 s); a peer that stays down costs each client two connection attempts a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // gRPC gives a connection attempt at least this long (its MIN_CONNECT_TIMEOUT, 20 s by
  // default): an attempt to a manager's old address, gone with its pod, waits that long (or for
  // the ARP failure, about 3 s) before the name is resolved again (kConnectTimeout).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(connect_timeout.count()));
  // A manager recreated elsewhere keeps its name (the svc plugin's hostname) and changes its
  // address: re-resolve the name at most once a second, not gRPC's default once in 30 s (on a
  // real control plane the agents found a moved manager 26 s after it listened).
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  const bool client_cert = !tls.cert_file.empty() || !tls.key_file.empty();
  if (tls.ca_file.empty()) {
    if (!tls.server_name.empty())
      return InvalidArgument("the TLS server name " + tls.server_name +
                             " needs a CA file: without one the connection is plaintext");
    if (client_cert)
      return InvalidArgument("the TLS client certificate " +
                             (tls.cert_file.empty() ? tls.key_file : tls.cert_file) +
                             " needs a CA file: without one the connection is plaintext");
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  auto ca = ReadCaFile(tls.ca_file);
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *ca;
  if (client_cert) {
    if (tls.cert_file.empty() || tls.key_file.empty())
      return InvalidArgument("a TLS client certificate needs both a certificate and a key file (" +
                             (tls.cert_file.empty() ? "key " + tls.key_file
                                                    : "certificate " + tls.cert_file) +
                             " given alone)");
    auto pair = ReadKeyPair(tls.cert_file, tls.key_file);
    if (!pair.ok()) return pair.status();
    ssl.pem_cert_chain = pair->cert;
    ssl.pem_private_key = pair->key;
  }
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}


StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& tls_cert_file, const std::string& tls_key_file,
    const std::string& client_ca_file) {
  if (tls_cert_file.empty() && tls_key_file.empty()) {
    if (!client_ca_file.empty())
      return InvalidArgument("the TLS client CA " + client_ca_file +
                             " needs the server's own certificate and key: clients are checked "
                             "only over TLS");
    return grpc::InsecureServerCredentials();
  }
  if (tls_cert_file.empty() || tls_key_file.empty())
    return InvalidArgument("TLS needs both a certificate and a key file");
  auto pair = ReadKeyPair(tls_cert_file, tls_key_file);
  if (!pair.ok()) return pair.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({pair->key, pair->cert});
  if (!client_ca_file.empty()) {
    auto ca = ReadCaFile(client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace regroup
