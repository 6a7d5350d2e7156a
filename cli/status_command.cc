// SPDX-License-Identifier: Apache-2.0
#include "cli/status_command.h"

#include <chrono>
#include <ctime>
#include <iomanip>
#include <ostream>

#include <google/protobuf/util/json_util.h>

#include "common/credential.h"
#include "common/grpc_settings.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace regroup::cli {

Status PrintStatus(const StatusOptions& options, std::ostream& out) {
  auto credential = LoadCredential(options.credential_file);
  if (!credential.ok()) return credential.status();
  auto channel = MakeChannel(options.manager, options.tls);
  if (!channel.ok()) {
    const std::string why = channel.status().message();
    const bool own = why.find("TLS client certificate") != std::string::npos ||
                     why.find("TLS certificate") != std::string::npos ||
                     why.find("TLS key") != std::string::npos;
    return InvalidArgument((own                           ? "--tls-cert/--tls-key: "
                            : options.tls.ca_file.empty() ? "--tls-server-name: "
                                                          : "--tls-ca: ") +
                           why);
  }
  auto stub = v1::Manager::NewStub(*channel);
  grpc::ClientContext context;
  AttachCredential(context, *credential);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options.timeout_ms));
  v1::GetStatusRequest request;
  request.set_job_id(options.job_id);
  v1::GetStatusResponse s;
  grpc::Status st = stub->GetStatus(&context, request, &s);
  if (!st.ok())
    return {REGROUP_FAILED_PRECONDITION, "the manager at " + options.manager +
                                             " did not answer: " +
                                             DescribeCallFailure(st, options.manager,
                                                                 !options.tls.ca_file.empty())};
  if (options.json) {
    std::string text;
    google::protobuf::util::JsonPrintOptions json;
    json.add_whitespace = true;
    json.preserve_proto_field_names = true;
    json.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(s, &text, json);
    out << text;
    return Status::Ok();
  }
  out << "job " << s.job_id() << ": " << s.phase() << ", epoch " << s.epoch() << " generation "
      << s.generation() << ", world size " << s.world_size() << " (dp " << s.data_parallel()
      << "), committed step " << s.committed_step() << "\n";
  out << "  node  state     pod                              ranks\n";
  for (const auto& n : s.nodes()) {
    std::string ranks;
    for (int i = 0; i < n.ranks_size(); ++i) ranks += (i ? "," : "") + std::to_string(n.ranks(i));
    out << "  " << std::setw(4) << n.node_rank() << "  " << std::left << std::setw(9) << n.state()
        << " " << std::setw(32) << (n.pod_uid().empty() ? "-" : n.pod_uid()) << " "
        << (ranks.empty() ? "-" : ranks) << std::right << "\n";
  }
  out << "  recent events:\n";
  const int first = std::max(0, s.events_size() - 15);
  for (int i = first; i < s.events_size(); ++i) {
    const auto& e = s.events(i);
    const std::time_t secs = static_cast<std::time_t>(e.at_ms() / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    out << "    " << std::put_time(&tm, "%H:%M:%S") << "." << std::setw(3) << std::setfill('0')
        << e.at_ms() % 1000 << std::setfill(' ') << "  " << e.kind() << ": " << e.message() << "\n";
  }
  return Status::Ok();
}

}  // namespace regroup::cli
