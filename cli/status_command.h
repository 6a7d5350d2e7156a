// SPDX-License-Identifier: Apache-2.0
// `regroupctl status`: asks a job's manager for its state (Manager.GetStatus) and prints it.
#pragma once

#include <iosfwd>
#include <string>

#include "common/grpc_settings.h"
#include "common/status.h"

namespace regroup::cli {

struct StatusOptions {
  std::string manager = "127.0.0.1:9601";
  std::string job_id;           // empty: whatever job the manager serves
  std::string credential_file;  // empty: $REGROUP_CREDENTIAL_FILE / $REGROUP_CREDENTIAL
  ClientTls tls;                // empty CA file: plaintext
  int timeout_ms = 5000;
  bool json = false;
};

// Prints the status to `out`. Errors say what failed and where (unreachable, refused).
Status PrintStatus(const StatusOptions& options, std::ostream& out);

}  // namespace regroup::cli
