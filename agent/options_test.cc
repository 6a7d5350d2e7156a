// SPDX-License-Identifier: Apache-2.0
// regroup-agent's command line: torchrun's flags, the agent's options and their environment
// fallbacks, and the errors a bad one gets.
#include "agent/options.h"

#include <map>

#include <gtest/gtest.h>

namespace regroup::agent {
namespace {

using Env = std::map<std::string, std::string>;

CommandLine Parse(const std::vector<std::string>& args, Env env = {}) {
  auto parsed = ParseCommandLine(args, EnvOf(std::move(env)));
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  return parsed.ok() ? *parsed : CommandLine{};
}

std::string Error(const std::vector<std::string>& args, Env env = {}) {
  auto parsed = ParseCommandLine(args, EnvOf(std::move(env)));
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(CommandLine, TakesTorchrunFlagsInEitherSpelling) {
  auto cl = Parse({"--nnodes", "2", "--nproc_per_node=4", "--node-rank", "1",
                   "--master_addr=10.0.0.1", "--master-port", "1234", "train.py", "--lr", "0.1"});
  const AgentOptions& o = cl.options;
  EXPECT_EQ(o.nnodes_min, 2);
  EXPECT_EQ(o.nnodes_max, 2);
  EXPECT_EQ(o.nproc, 4);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.script, (std::vector<std::string>{"train.py", "--lr", "0.1"}));
  EXPECT_TRUE(cl.notices.empty());
  EXPECT_EQ(TrainerArgv(o), (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "0.1"}));
}

// Issue 40, finding 8: --manager's port was not checked, and 127.0.0.1:P+65536 reached port P
// (the credential went to a port the user did not name). Checked as the manager's own flags.
TEST(CommandLine, TheManagerAddressIsCheckedAsTheManagersOwnFlags) {
  EXPECT_EQ(Error({"--manager", "127.0.0.1:75537", "train.py"}),
            "--manager \"127.0.0.1:75537\": the port must be a number from 1 to 65535");
  EXPECT_EQ(Error({"train.py"}, {{"REGROUP_MANAGER_ADDR", "127.0.0.1:0"}}),
            "--manager \"127.0.0.1:0\": the port must be from 1 to 65535");
  EXPECT_EQ(Parse({"--manager", "[::1]:9601", "train.py"}).options.manager_addr, "[::1]:9601");
}

TEST(CommandLine, NnodesTakesARange) {
  auto cl = Parse({"--nnodes=1:4", "train.py"});
  EXPECT_EQ(cl.options.nnodes_min, 1);
  EXPECT_EQ(cl.options.nnodes_max, 4);
  EXPECT_EQ(cl.options.node_rank, -1);  // several nodes, none named: the manager assigns one
}

TEST(CommandLine, OneNodeIsNodeRankZero) {
  EXPECT_EQ(Parse({"train.py"}).options.node_rank, 0);
}

TEST(CommandLine, IgnoresRendezvousAndOtherTorchrunFlagsWithOneNoticeEach) {
  auto cl = Parse({"--rdzv-backend", "c10d", "--rdzv_endpoint=host:29400", "--rdzv-id", "job",
                   "--rdzv-conf", "timeout=9", "--max-restarts", "3", "--monitor-interval", "1",
                   "--standalone", "--redirects", "3", "-t", "3", "--role", "worker",
                   "--start-method", "spawn", "--log-dir", "/logs", "--run-path", "train.py"});
  ASSERT_EQ(cl.notices.size(), 13u);
  EXPECT_NE(cl.notices[0].find("--rdzv-backend=c10d ignored"), std::string::npos)
      << cl.notices[0];
  EXPECT_NE(cl.notices[1].find("--rdzv_endpoint=host:29400 ignored"), std::string::npos)
      << cl.notices[1];
  EXPECT_NE(cl.notices[6].find("--standalone ignored"), std::string::npos) << cl.notices[6];
  EXPECT_EQ(cl.options.script, (std::vector<std::string>{"train.py"}));
}

TEST(CommandLine, DashMRunsAModule) {
  auto cl = Parse({"--python", "/opt/py/bin/python", "-m", "pkg.train", "--epochs", "2"});
  EXPECT_TRUE(cl.options.module);
  EXPECT_EQ(TrainerArgv(cl.options), (std::vector<std::string>{"/opt/py/bin/python", "-u", "-m",
                                                               "pkg.train", "--epochs", "2"}));
}

TEST(CommandLine, NoPythonRunsTheScriptItself) {
  auto cl = Parse({"--no_python", "./run.sh", "a"});
  EXPECT_EQ(TrainerArgv(cl.options), (std::vector<std::string>{"./run.sh", "a"}));
}

TEST(CommandLine, EverythingAfterTheScriptOrDoubleDashIsTheScripts) {
  auto after_script = Parse({"train.py", "--nproc-per-node", "9"});
  EXPECT_EQ(after_script.options.nproc, 1);
  EXPECT_EQ(after_script.options.script.size(), 3u);
  auto after_dashes = Parse({"--nproc-per-node", "2", "--", "--odd-name.py", "x"});
  EXPECT_EQ(after_dashes.options.nproc, 2);
  EXPECT_EQ(after_dashes.options.script, (std::vector<std::string>{"--odd-name.py", "x"}));
}

TEST(CommandLine, BadValuesNameTheFlagAndWhatIsAllowed) {
  std::string e = Error({"--nproc-per-node", "auto", "train.py"});
  EXPECT_NE(e.find("--nproc-per-node \"auto\""), std::string::npos) << e;
  EXPECT_NE(e.find("positive integer"), std::string::npos) << e;
  e = Error({"--nnodes", "3:2", "train.py"});
  EXPECT_NE(e.find("--nnodes \"3:2\""), std::string::npos) << e;
  EXPECT_NE(e.find("MIN <= MAX"), std::string::npos) << e;
  e = Error({"--master_port=70000", "train.py"});
  EXPECT_NE(e.find("--master_port \"70000\""), std::string::npos) << e;
  e = Error({"--nnodes", "2", "--node-rank", "2", "train.py"});
  EXPECT_NE(e.find("--node-rank 2 is not below --nnodes 2"), std::string::npos) << e;
  e = Error({"--reconnect-timeout-s", "0", "train.py"});
  EXPECT_NE(e.find("--reconnect-timeout-s \"0\""), std::string::npos) << e;
  e = Error({"--connect-timeout-s", "0", "train.py"});
  EXPECT_NE(e.find("--connect-timeout-s \"0\" is not valid: seconds, an integer from 1 to 86400"),
            std::string::npos)
      << e;
  e = Error({"--log-level", "loud", "train.py"});
  EXPECT_NE(e.find("trace, debug, info"), std::string::npos) << e;
  e = Error({"--log-format", "yaml", "train.py"});
  EXPECT_NE(e.find("--log-format \"yaml\" is not a log format: text or json"), std::string::npos)
      << e;
}

TEST(CommandLine, MalformedCommandLinesSayWhatIsWrong) {
  EXPECT_NE(Error({"--bogus", "train.py"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(Error({"-x", "train.py"}).find("unknown flag -x"), std::string::npos);
  EXPECT_NE(Error({"--manager"}).find("flag --manager needs a value"), std::string::npos);
  EXPECT_NE(Error({"--standalone=1", "train.py"}).find("--standalone takes no value"),
            std::string::npos);
  EXPECT_NE(Error({"--nproc-per-node", "2"}).find("no training script"), std::string::npos);
  EXPECT_NE(Error({"-m", "--no-python", "x"}).find("cannot be used together"), std::string::npos);
}

TEST(CommandLine, WarmStartIsOnForPythonAndTakesTheModulesToImport) {
  AgentOptions o = Parse({"train.py"}).options;
  EXPECT_TRUE(o.warm_start);
  EXPECT_EQ(o.warm_imports, (std::vector<std::string>{"torch", "torch.distributed", "regroup.trainer"}));
  o = Parse({"--warm-start", "off", "--warm-imports", "torch,my_pkg.model2", "train.py"}).options;
  EXPECT_FALSE(o.warm_start);
  EXPECT_EQ(o.warm_imports, (std::vector<std::string>{"torch", "my_pkg.model2"}));
  o = Parse({"train.py"}, {{"REGROUP_WARM_START", "off"}, {"REGROUP_WARM_IMPORTS", "numpy"}})
          .options;
  EXPECT_FALSE(o.warm_start);
  EXPECT_EQ(o.warm_imports, std::vector<std::string>{"numpy"});
  EXPECT_FALSE(Parse({"--no-python", "./train"}).options.warm_start) << "nothing to import";
  std::string e = Error({"--warm-start", "yes", "train.py"});
  EXPECT_NE(e.find("--warm-start \"yes\" is not valid: on or off"), std::string::npos) << e;
  for (const char* bad : {"torch,,numpy", "torch.", "2fast", "os;rm", "a b"}) {
    e = Error({"--warm-imports", bad, "train.py"});
    EXPECT_NE(e.find("is not a Python module name"), std::string::npos) << bad << ": " << e;
  }
}

TEST(CommandLine, HelpNeedsNoScript) { EXPECT_TRUE(Parse({"--help"}).help); }

TEST(CommandLine, VersionNeedsNoScript) {
  const CommandLine cl = Parse({"--nproc-per-node", "2", "--version"});
  EXPECT_TRUE(cl.version);
  EXPECT_FALSE(cl.help);
}

TEST(CommandLine, AgentOptionsFallBackToTheEnvironment) {
  auto cl = Parse({"train.py"}, {{"REGROUP_MANAGER_ADDR", "mgr:1"},
                                 {"MINDX_TASK_ID", "mindx-job"},
                                 {"REGROUP_POD_UID", "uid-7"},
                                 {"HOSTNAME", "pod-from-hostname"},
                                 {"REGROUP_NODE_NAME", "node-3"},
                                 {"REGROUP_HOST", "10.1.1.1"},
                                 {"REGROUP_SOCKET_DIR", "/run/r"},
                                 {"REGROUP_RECONNECT_TIMEOUT_S", "9"},
                                 {"REGROUP_CONNECT_TIMEOUT_S", "600"},
                                 {"PYTHON", "/usr/bin/python3.11"},
                                 {"PET_NPROC_PER_NODE", "8"}});
  const AgentOptions& o = cl.options;
  EXPECT_EQ(o.manager_addr, "mgr:1");
  EXPECT_EQ(o.job_id, "mindx-job");
  EXPECT_EQ(o.pod_uid, "uid-7");
  EXPECT_EQ(o.pod_name, "pod-from-hostname");
  EXPECT_EQ(o.node_name, "node-3");
  EXPECT_EQ(o.host, "10.1.1.1");
  EXPECT_EQ(o.socket_dir, "/run/r");
  EXPECT_EQ(o.reconnect_timeout_s, 9);
  EXPECT_EQ(o.connect_timeout_s, 600);
  EXPECT_EQ(o.python, "/usr/bin/python3.11");
  EXPECT_EQ(o.nproc, 8);
}

TEST(CommandLine, RegroupVariablesWinOverOthersAndFlagsWinOverAll) {
  Env env = {{"MINDX_TASK_ID", "mindx"}, {"REGROUP_JOB_ID", "regroup"},
             {"HOSTNAME", "h"},          {"REGROUP_POD_NAME", "p"},
             {"REGROUP_MANAGER_ADDR", "env:1"}};
  auto from_env = Parse({"train.py"}, env);
  EXPECT_EQ(from_env.options.job_id, "regroup");
  EXPECT_EQ(from_env.options.pod_name, "p");
  auto from_flags = Parse({"--job-id", "flag", "--manager", "flag:2", "train.py"}, env);
  EXPECT_EQ(from_flags.options.job_id, "flag");
  EXPECT_EQ(from_flags.options.manager_addr, "flag:2");
}

// The manager and the scheduler name a pod by one index (the engine's pod = node rank), so in a
// Volcano Job's pod the node rank is the pod's index in its task, VC_TASK_INDEX, which Volcano's
// job controller sets in every container; torchrun's PET_NODE_RANK and the flag win over it.
TEST(CommandLine, TheNodeRankIsVolcanosTaskIndexUnlessGiven) {
  EXPECT_EQ(Parse({"--nnodes", "4", "train.py"}, {{"VC_TASK_INDEX", "3"}}).options.node_rank, 3);
  EXPECT_EQ(Parse({"--nnodes", "4", "train.py"}, {{"VC_TASK_INDEX", "3"}, {"PET_NODE_RANK", "1"}})
                .options.node_rank,
            1);
  EXPECT_EQ(Parse({"--nnodes", "4", "--node-rank", "2", "train.py"}, {{"VC_TASK_INDEX", "3"}})
                .options.node_rank,
            2);
  EXPECT_LT(Parse({"--nnodes", "4", "train.py"}).options.node_rank, 0);  // the manager assigns one
  std::string e = Error({"--nnodes", "2", "train.py"}, {{"VC_TASK_INDEX", "2"}});
  EXPECT_NE(e.find("environment variable VC_TASK_INDEX"), std::string::npos) << e;
}

TEST(CommandLine, TlsTakesACaAndAServerNameFromFlagsOrTheEnvironment) {
  auto from_env = Parse({"train.py"}, {{"REGROUP_TLS_CA_FILE", "/etc/regroup/tls/ca.crt"},
                                       {"REGROUP_TLS_SERVER_NAME", "mgr.default.svc"}});
  EXPECT_EQ(from_env.options.tls_ca_file, "/etc/regroup/tls/ca.crt");
  EXPECT_EQ(from_env.options.tls_server_name, "mgr.default.svc");
  auto from_flags = Parse({"--tls-ca", "ca.pem", "--tls-server-name=m", "train.py"},
                          {{"REGROUP_TLS_CA_FILE", "env.pem"}});
  EXPECT_EQ(from_flags.options.tls_ca_file, "ca.pem");
  EXPECT_EQ(from_flags.options.tls_server_name, "m");
  EXPECT_TRUE(Parse({"train.py"}).options.tls_ca_file.empty());  // plaintext by default
}

TEST(CommandLine, AServerNameWithoutACaIsRefused) {
  // Alone it would change nothing: the connection would stay plaintext.
  std::string e = Error({"--tls-server-name", "m", "train.py"});
  EXPECT_EQ(e, "flag --tls-server-name (or REGROUP_TLS_SERVER_NAME) m needs --tls-ca (or "
               "REGROUP_TLS_CA_FILE): the manager's CA bundle");
  EXPECT_NE(Error({"--tls-ca", "", "train.py"}).find("flag --tls-ca needs a non-empty value"),
            std::string::npos);
}

// Issue 14: in MindCluster's layout the manager runs on rank 0's pod, and its agents find it at
// $MASTER_ADDR:9601; an agent given no manager address looked at 127.0.0.1:9601 instead.
TEST(CommandLine, WithNoManagerNamedTheAgentLooksOnRankZerosPodAsMindClusters) {
  EXPECT_EQ(Parse({"train.py"}).options.manager_addr, "127.0.0.1:9601");
  EXPECT_EQ(Parse({"train.py"}, {{"MASTER_ADDR", "10.1.2.3"}}).options.manager_addr,
            "10.1.2.3:9601");
  EXPECT_EQ(Parse({"train.py"}, {{"MASTER_ADDR", "fd00::7"}}).options.manager_addr,
            "[fd00::7]:9601");
  EXPECT_EQ(Parse({"--master-addr", "10.9.9.9", "train.py"}).options.manager_addr,
            "10.9.9.9:9601");
  EXPECT_EQ(Parse({"train.py"}, {{"PET_MASTER_ADDR", "10.9.9.8"}}).options.manager_addr,
            "10.9.9.8:9601");
  // The explicit address keeps precedence over both.
  EXPECT_EQ(Parse({"train.py"}, {{"MASTER_ADDR", "10.1.2.3"}, {"REGROUP_MANAGER_ADDR", "mgr:1"}})
                .options.manager_addr,
            "mgr:1");
  EXPECT_EQ(Parse({"--manager", "flag:2", "train.py"}, {{"MASTER_ADDR", "10.1.2.3"}})
                .options.manager_addr,
            "flag:2");
}

TEST(CommandLine, ABadEnvironmentValueNamesTheVariable) {
  std::string e = Error({"train.py"}, {{"REGROUP_RECONNECT_TIMEOUT_S", "soon"}});
  EXPECT_NE(e.find("environment variable REGROUP_RECONNECT_TIMEOUT_S \"soon\""),
            std::string::npos)
      << e;
}

TEST(ResolveDefaults, NodeRankZeroIsReachedAtTheMasterAddress) {
  AgentOptions o = Parse({"--master-addr", "10.9.8.7", "train.py"}).options;
  ResolveDefaults(o, EnvOf({{"TMPDIR", "/scratch/"}}));
  EXPECT_EQ(o.host, "10.9.8.7");
  EXPECT_EQ(o.pod_uid.size(), 36u);
  EXPECT_EQ(o.pod_uid[14], '4');  // a version-4 uid
  EXPECT_EQ(o.socket_dir, "/scratch/regroup-" + o.pod_uid);
  EXPECT_FALSE(o.pod_name.empty());
}

TEST(ResolveDefaults, OtherNodesUseTheirOwnAddress) {
  AgentOptions o = Parse({"--nnodes", "2", "--node-rank", "1", "train.py"}).options;
  ResolveDefaults(o, EnvOf({}));
  EXPECT_EQ(o.host, FirstNonLoopbackIpv4().value_or("127.0.0.1"));
  EXPECT_EQ(o.socket_dir.rfind("/tmp/regroup-", 0), 0u) << o.socket_dir;
  EXPECT_NE(RandomUid(), RandomUid());
}

TEST(CheckResolved, ASocketPathTooLongOrAMissingInterpreterNamesTheFlag) {
  AgentOptions o = Parse({"--python", "/bin/sh", "train.py"}).options;
  o.socket_dir = "/tmp";
  EXPECT_TRUE(CheckResolved(o, EnvOf({})).ok());
  o.socket_dir = "/tmp/" + std::string(120, 'd');
  Status long_path = CheckResolved(o, EnvOf({}));
  EXPECT_NE(long_path.message().find("flag --socket-dir"), std::string::npos)
      << long_path.message();
  o.socket_dir = "/tmp";
  o.python = "no-such-python-here";
  Status missing = CheckResolved(o, EnvOf({{"PATH", "/nonexistent"}}));
  EXPECT_NE(missing.message().find("flag --python: cannot run no-such-python-here"),
            std::string::npos)
      << missing.message();
}

TEST(TrainerEnvironment, HasTorchrunsVariablesAndRegroups) {
  AgentOptions o = Parse({"--nnodes", "3", "--nproc-per-node", "4", "--node-rank", "2",
                          "--master-addr", "m", "--master-port", "5000", "--job-id", "j",
                          "--pod-uid", "u", "train.py"})
                       .options;
  auto env = TrainerEnvironment(o, o.node_rank, 3, "/s/agent.sock", false);
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m["RANK"], "11");
  EXPECT_EQ(m["LOCAL_RANK"], "3");
  EXPECT_EQ(m["WORLD_SIZE"], "12");
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(m["GROUP_RANK"], "2");
  EXPECT_EQ(m["MASTER_ADDR"], "m");
  EXPECT_EQ(m["MASTER_PORT"], "5000");
  EXPECT_EQ(m["REGROUP_AGENT_SOCKET"], "/s/agent.sock");
  EXPECT_EQ(m["REGROUP_LOCAL_RANK"], "3");
  EXPECT_EQ(m["REGROUP_JOB_ID"], "j");
  EXPECT_EQ(m["REGROUP_POD_UID"], "u");
  EXPECT_EQ(m["OMP_NUM_THREADS"], "1");
  auto keep_omp = TrainerEnvironment(o, -1, 0, "/s", true);
  std::map<std::string, std::string> k(keep_omp.begin(), keep_omp.end());
  EXPECT_EQ(k.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(k["RANK"], "0");  // node rank not known yet: provisional 0
}

}  // namespace
}  // namespace regroup::agent
