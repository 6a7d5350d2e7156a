// SPDX-License-Identifier: Apache-2.0
// Certificates for TLS tests, made by the openssl command line in a fresh folder for each run
// (manager/tls_test.cc, tests/coordinator_test.cc). Test code only.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace regroup::testing {

// The files of one run:
//   ca.crt            the job's CA;  other-ca.crt  a CA that signed nothing of the manager's
//   ip.crt/.key       signed by ca, for IP:127.0.0.1
//   named.crt/.key    signed by ca, for DNS:manager.default.svc only
//   stranger.crt/.key signed by other-ca, for IP:127.0.0.1
//   expired.crt/.key  signed by ca, for IP:127.0.0.1, valid until yesterday
class Certificates {
 public:
  static constexpr char kServerName[] = "manager.default.svc";

  Certificates() {
    char tmpl[] = "/tmp/regroup-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    for (const char* ca : {"ca", "other-ca"})
      Run("openssl req -x509 " + ec + " -keyout " + ca + ".key -out " + ca + ".crt -days 2 -subj "
          "/CN=" + ca);
    Sign("ip", "ca", "IP:127.0.0.1", 2);
    Sign("named", "ca", std::string("DNS:") + kServerName, 2);
    Sign("stranger", "other-ca", "IP:127.0.0.1", 2);
    Sign("expired", "ca", "IP:127.0.0.1", -1);  // its validity ends a day before it begins
  }
  ~Certificates() { std::filesystem::remove_all(dir_); }
  Certificates(const Certificates&) = delete;
  Certificates& operator=(const Certificates&) = delete;

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  bool ok() const { return ok_; }

 private:
  void Run(const std::string& command) {
    const std::string line = "cd " + dir_ + " && " + command + " >>openssl.log 2>&1";
    if (std::system(line.c_str()) != 0) ok_ = false;
  }
  void Sign(const std::string& name, const std::string& ca, const std::string& san, int days) {
    Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout " + name +
        ".key -out " + name + ".csr -subj /CN=" + name);
    std::ofstream(Path(name + ".ext")) << "subjectAltName=" << san << "\n";
    Run("openssl x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca +
        ".key -CAcreateserial -days " + std::to_string(days) + " -extfile " + name + ".ext -out " +
        name + ".crt");
  }

  std::string dir_;
  bool ok_ = true;
};

}  // namespace regroup::testing
