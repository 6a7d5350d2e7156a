// SPDX-License-Identifier: Apache-2.0
#include "common/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

namespace regroup {
namespace {

std::string HmacHex(std::string_view key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // An empty key (a coordinator run without one) is still a valid HMAC key; OpenSSL wants a
  // non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len))
    throw std::runtime_error("OpenSSL's HMAC-SHA256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 0xf]);
  }
  return out;
}

std::string Joined(std::initializer_list<std::string_view> parts) {
  std::string m;
  bool first = true;
  for (std::string_view p : parts) {
    if (!first) m.push_back('\0');
    m.append(p);
    first = false;
  }
  return m;
}

}  // namespace

std::string JobToken(std::string_view cluster_key, std::string_view job_id,
                     std::string_view job_uid) {
  return HmacHex(cluster_key, Joined({"regroup-job-v1", job_id, job_uid}));
}

std::string EpochTicket(std::string_view cluster_key, std::string_view job_id,
                        std::string_view job_uid, uint64_t epoch) {
  const std::string e = std::to_string(epoch);
  return HmacHex(cluster_key, Joined({"regroup-epoch-v1", job_id, job_uid, e}));
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace regroup
