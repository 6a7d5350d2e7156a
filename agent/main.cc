// SPDX-License-Identifier: Apache-2.0
// regroup-agent: replaces torchrun in a pod's command line. See agent.h for what it does and
// options.h for its command line.
#include <cstdio>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "agent/agent.h"
#include "agent/options.h"
#include "common/credential.h"
#include "common/log_format.h"
#include "common/version.h"

int main(int argc, char** argv) {
  using namespace regroup::agent;
  std::vector<std::string> args(argv + 1, argv + argc);
  const regroup::EnvLookup env = regroup::ProcessEnv();
  auto parsed = ParseCommandLine(args, env);
  if (!parsed.ok()) {
    std::fprintf(stderr, "regroup-agent: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  if (parsed->version) {
    std::printf("regroup-agent %s\n", REGROUP_VERSION_STRING);
    return 0;
  }
  AgentOptions options = parsed->options;
  ResolveDefaults(options, env);
  if (auto checked = CheckResolved(options, env); !checked.ok()) {
    std::fprintf(stderr, "regroup-agent: %s\n", checked.message().c_str());
    return 2;
  }

  // One line per event on stderr, each naming this pod ('%' in a uid must not start a flag).
  std::string uid;
  for (char c : options.pod_uid) uid += c == '%' ? std::string("%%") : std::string(1, c);
  spdlog::set_default_logger(spdlog::stderr_color_mt("regroup-agent"));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ regroup-agent " + uid + " %v");
  regroup::UseLogFormat(*regroup::ParseLogFormat(options.log_format), "regroup-agent",
                        {{"pod", options.pod_uid}});
  spdlog::set_level(spdlog::level::from_str(options.log_level));
  for (const std::string& notice : parsed->notices) spdlog::info("{}", notice);

  auto credential = regroup::LoadCredential(options.credential_file);
  if (!credential.ok()) {
    std::fprintf(stderr, "regroup-agent: flag --credential-file (or REGROUP_CREDENTIAL_FILE): %s\n",
                 credential.status().message().c_str());
    return 2;
  }
  if (options.job_id.empty())
    spdlog::warn("no job id (--job-id, REGROUP_JOB_ID or MINDX_TASK_ID): the manager may refuse "
                 "this agent");
  if (credential->empty())
    spdlog::warn("no credential (--credential-file, REGROUP_CREDENTIAL_FILE or "
                 "REGROUP_CREDENTIAL): only a manager without one accepts this agent");
  Agent agent(options, *credential);
  return agent.Run();
}
