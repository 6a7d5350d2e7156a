// SPDX-License-Identifier: Apache-2.0
// regroup-manager's command line: its defaults, the environment fallbacks, the job the flags
// give, and the errors a bad one gets.
#include "manager/options.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "common/version.h"

namespace regroup::manager {
namespace {

using Env = std::map<std::string, std::string>;

// The value of `result`; an error fails the test, naming its message.
template <typename T>
T Ok(StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status().message();
  return result.ok() ? *result : T{};
}

// The message of the error `result` must be.
template <typename T>
std::string Refused(const StatusOr<T>& result) {
  EXPECT_FALSE(result.ok());
  return result.ok() ? "" : result.status().message();
}

using Args = std::vector<std::string>;

// The tests of other flags run standalone managers that accept running without a record (the
// rule's own test is AStandaloneManagerWithoutARecordIsRefusedUnlessItAcceptsTheRisk).
CommandLine Parse(const Args& args, const Env& env = {}) {
  auto parsed = ParseCommandLine(args, EnvOf(env));
  if (!parsed.ok() && parsed.status().message().starts_with("no durable record")) {
    Args accepting = args;
    accepting.push_back("--no-record");
    parsed = ParseCommandLine(accepting, EnvOf(env));
  }
  return Ok(parsed);
}
std::string Error(const Args& args, const Env& env = {}) {
  return Refused(ParseCommandLine(args, EnvOf(env)));
}
JobSpec Job(const Args& args, const Env& env = {}) {
  return Ok(ReadJobSpec(Parse(args, env).options, EnvOf(env)));
}
std::string JobError(const Args& args, const Env& env = {}) {
  return Refused(ReadJobSpec(Parse(args, env).options, EnvOf(env)));
}

// A file in a folder of this test's own, removed at the end.
class ManagerJobFile : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::filesystem::create_directories(dir_);
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  const std::filesystem::path dir_ = std::filesystem::temp_directory_path() /
                                     ("regroup-options-" + std::to_string(::getpid()));
};

TEST(ManagerCommandLine, DefaultsAreMindClustersPortNoHttpAndAThirtySecondJoinWindow) {
  const CommandLine cl = Parse({});
  const ManagerOptions& o = cl.options;
  EXPECT_EQ(o.listen, "0.0.0.0:9601");
  EXPECT_EQ(o.http, "");
  EXPECT_EQ(o.join_window_s, 30);
  EXPECT_EQ(o.epoch, 0);
  EXPECT_EQ(o.coordinator, "");
  EXPECT_EQ(o.record_file, "");
  EXPECT_FALSE(o.insecure);
  EXPECT_FALSE(o.metrics_open);
  EXPECT_TRUE(cl.notices.empty());
  EXPECT_FALSE(cl.reply.has_value());
}

TEST(ManagerCommandLine, TakesEveryFlagAndMindClustersSpellings) {
  const ManagerOptions o =
      Parse({"--job-id", "ns/j", "--node-nums", "4", "--proc-per-node", "8", "--label", "a=1",
             "--label", "b=2", "--annotation", "c=3", "--env", "MINDIO_WAIT_MINDX_TIME=60",
             "--keys-source", "the API", "--listen", "127.0.0.1:0", "--http", "[::1]:9000",
             "--metrics-open", "--port-file", "p", "--credential-file", "c", "--insecure",
             "--tls-cert", "cert", "--tls-key", "key", "--join-window-s", "5", "--epoch", "7",
             "--record", "r.json"})
          .options;
  EXPECT_EQ(o.job_id, "ns/j");
  EXPECT_EQ(o.nodes, 4);
  EXPECT_EQ(o.nproc, 8);
  EXPECT_EQ(o.labels, (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(o.annotations, std::vector<std::string>{"c=3"});
  EXPECT_EQ(o.env, std::vector<std::string>{"MINDIO_WAIT_MINDX_TIME=60"});
  EXPECT_EQ(o.keys_source, "the API");
  EXPECT_EQ(o.listen, "127.0.0.1:0");
  EXPECT_EQ(o.http, "[::1]:9000");
  EXPECT_TRUE(o.metrics_open);
  EXPECT_EQ(o.port_file, "p");
  EXPECT_EQ(o.credential_file, "c");
  EXPECT_TRUE(o.insecure);
  EXPECT_EQ(o.tls_cert, "cert");
  EXPECT_EQ(o.tls_key, "key");
  EXPECT_EQ(o.join_window_s, 5);
  EXPECT_EQ(o.epoch, 7);
  EXPECT_EQ(o.record_file, "r.json");
}

// A manager.py that cannot pass flags takes its addresses and record from its pod's environment.
TEST(ManagerCommandLine, AddressesAndTheRecordFallBackToTheEnvironmentAndFlagsWin) {
  const Env env = {{"REGROUP_MANAGER_LISTEN", "127.0.0.1:1"},
                   {"REGROUP_MANAGER_HTTP", "127.0.0.1:2"},
                   {"REGROUP_RECORD_FILE", "/ckpt/record.json"}};
  const ManagerOptions from_env = Parse({}, env).options;
  EXPECT_EQ(from_env.listen, "127.0.0.1:1");
  EXPECT_EQ(from_env.http, "127.0.0.1:2");
  EXPECT_EQ(from_env.record_file, "/ckpt/record.json");
  const ManagerOptions from_flags =
      Parse({"--listen", "127.0.0.1:3", "--http", "127.0.0.1:4", "--record", "mine.json"}, env)
          .options;
  EXPECT_EQ(from_flags.listen, "127.0.0.1:3");
  EXPECT_EQ(from_flags.http, "127.0.0.1:4");
  EXPECT_EQ(from_flags.record_file, "mine.json");
  EXPECT_EQ(Parse({}, {{"REGROUP_MANAGER_LISTEN", ""}}).options.listen, "0.0.0.0:9601")
      << "an empty variable is no variable";
}

TEST(ManagerCommandLine, ABadAddressNamesTheFlagTheValueAndWhatIsAllowed) {
  std::string e = Error({"--listen", "127.0.0.1:99999"});
  EXPECT_NE(e.find("--listen \"127.0.0.1:99999\""), std::string::npos) << e;
  EXPECT_NE(e.find("the port must be a number from 0 to 65535"), std::string::npos) << e;
  e = Error({"--http", "localhost"});
  EXPECT_NE(e.find("--http \"localhost\": give HOST:PORT"), std::string::npos) << e;
  // From the environment, the error names the flag the variable stands for.
  e = Error({}, {{"REGROUP_MANAGER_HTTP", "::1:80"}});
  EXPECT_NE(e.find("--http \"::1:80\": write an IPv6 host in brackets"), std::string::npos) << e;
}

TEST(ManagerCommandLine, TheLogFormatIsTextOrJsonFromTheFlagOrTheEnvironment) {
  EXPECT_EQ(Parse({}).options.log_format, "text");
  EXPECT_EQ(Parse({}, {{"REGROUP_LOG_FORMAT", "json"}}).options.log_format, "json");
  EXPECT_EQ(Parse({"--log-format", "text"}, {{"REGROUP_LOG_FORMAT", "json"}}).options.log_format,
            "text");
  EXPECT_EQ(Error({"--log-format", "yaml"}),
            "--log-format \"yaml\" is not a log format: text or json");
  EXPECT_EQ(Error({}, {{"REGROUP_LOG_FORMAT", "logfmt"}}),
            "$REGROUP_LOG_FORMAT \"logfmt\" is not a log format: text or json");
}

TEST(ManagerCommandLine, TheManagerExitsAfterTheJobUnlessToldToStay) {
  EXPECT_FALSE(Parse({}).options.stay_after_done);
  EXPECT_TRUE(Parse({"--stay-after-done"}).options.stay_after_done);
}

TEST(ManagerCommandLine, ANumberOutOfRangeNamesTheFlagTheValueAndTheRange) {
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  for (const Case& c : {
           Case{{"--nodes", "2000000000"}, "--nodes: Value 2000000000 not in range 1 to 100000"},
           Case{{"--nodes", "four"}, "--nodes: Value four not in range 1 to 100000"},
           Case{{"--nproc-per-node", "0"}, "--nproc-per-node: Value 0 not in range 1 to 1024"},
           Case{{"--join-window-s", "3601"}, "--join-window-s: Value 3601 not in range 1 to 3600"},
           Case{{"--epoch", "-1"}, "--epoch: Value -1 not in range 1 to 1152921504606846976"},
       }) {
    const std::string e = Error(c.args);
    EXPECT_NE(e.find(c.want), std::string::npos) << c.args[0] << ": " << e;
  }
}

TEST(ManagerCommandLine, AnUnknownFlagAStrayArgumentOrAMissingValueIsNamed) {
  EXPECT_EQ(Error({"--nodez", "2"}), "unknown flag --nodez: see regroup-manager --help");
  EXPECT_EQ(Error({"--nodes", "2", "4"}),
            "unexpected argument \"4\": regroup-manager takes flags only (see --help)");
  const std::string e = Error({"--job-id"});
  EXPECT_NE(e.find("--job-id: 1 required TEXT missing"), std::string::npos) << e;
}

TEST(ManagerCommandLine, HelpAndVersionAreRepliesNotErrors) {
  const CommandLine help = Parse({"--nodes", "2", "--help"});
  ASSERT_TRUE(help.reply.has_value());
  EXPECT_NE(help.reply->find("--nproc-per-node"), std::string::npos) << *help.reply;
  EXPECT_NE(help.reply->find("--version"), std::string::npos) << *help.reply;
  const CommandLine version = Parse({"--nodes", "2", "--version"});
  ASSERT_TRUE(version.reply.has_value());
  EXPECT_EQ(*version.reply, std::string("regroup-manager ") + REGROUP_VERSION_STRING + "\n");
}

TEST(ManagerCommandLine, TheCoordinatorAndItsTokenFallBackToTheEnvironment) {
  const ManagerOptions o = Parse({}, {{"REGROUP_COORDINATOR_ADDR", "coord:8899"},
                                      {"REGROUP_COORDINATOR_CREDENTIAL_FILE", "/token"}})
                               .options;
  EXPECT_EQ(o.coordinator, "coord:8899");
  EXPECT_EQ(o.coordinator_credential_file, "/token");
  EXPECT_EQ(Parse({"--coordinator", "flag:1"}, {{"REGROUP_COORDINATOR_ADDR", "coord:8899"}})
                .options.coordinator,
            "flag:1");
}

// Mutual TLS with the coordinator (issue 40): this manager's certificate and key, from the flags
// or the environment, go together and need the coordinator's CA (else the link is plaintext).
TEST(ManagerCommandLine, TheCoordinatorClientCertificateAndKeyGoTogetherWithItsCa) {
  const Args ca = {"--coordinator", "c:1", "--coordinator-ca", "/ca.crt"};
  Args both = ca;
  both.insert(both.end(), {"--coordinator-tls-cert", "/m.crt", "--coordinator-tls-key", "/m.key"});
  ManagerOptions o = Parse(both).options;
  EXPECT_EQ(o.coordinator_tls_cert, "/m.crt");
  EXPECT_EQ(o.coordinator_tls_key, "/m.key");
  o = Parse(ca, {{"REGROUP_COORDINATOR_TLS_CERT_FILE", "/e.crt"},
                 {"REGROUP_COORDINATOR_TLS_KEY_FILE", "/e.key"}})
          .options;
  EXPECT_EQ(o.coordinator_tls_cert, "/e.crt");
  EXPECT_EQ(o.coordinator_tls_key, "/e.key");
  EXPECT_EQ(Parse(both, {{"REGROUP_COORDINATOR_TLS_CERT_FILE", "/e.crt"}}).options.coordinator_tls_cert,
            "/m.crt")
      << "the flag wins";
  Args alone = ca;
  alone.insert(alone.end(), {"--coordinator-tls-cert", "/m.crt"});
  std::string e = Error(alone);
  EXPECT_NE(e.find("--coordinator-tls-cert and --coordinator-tls-key"), std::string::npos) << e;
  EXPECT_NE(e.find("the certificate /m.crt is given alone"), std::string::npos) << e;
  e = Error(ca, {{"REGROUP_COORDINATOR_TLS_KEY_FILE", "/e.key"}});
  EXPECT_NE(e.find("the key /e.key is given alone"), std::string::npos) << e;
  e = Error({"--coordinator", "c:1", "--coordinator-tls-cert", "/m.crt", "--coordinator-tls-key",
             "/m.key"});
  EXPECT_NE(e.find("--coordinator-tls-cert /m.crt needs --coordinator-ca"), std::string::npos) << e;
}

// Inside a Kubernetes pod that holds its job's coordinator token, the coordinator is found at its
// Service with no address given; outside one, or without the token, there is none.
TEST(ManagerCommandLine, InAKubernetesPodWithACoordinatorTokenTheCoordinatorIsItsService) {
  const Env pod = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                   {"REGROUP_COORDINATOR_CREDENTIAL_FILE", "/token"}};
  const CommandLine cl = Parse({}, pod);
  EXPECT_EQ(cl.options.coordinator, "regroup-coordinator.volcano-system.svc:8899");
  ASSERT_EQ(cl.notices.size(), 1u);
  EXPECT_NE(cl.notices[0].find("the coordinator is regroup-coordinator.volcano-system.svc:8899"),
            std::string::npos)
      << cl.notices[0];
  EXPECT_EQ(Parse({}, {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}).options.coordinator, "");
  EXPECT_EQ(Parse({}, {{"REGROUP_COORDINATOR_CREDENTIAL_FILE", "/token"}}).options.coordinator,
            "");
  EXPECT_EQ(Parse({"--coordinator", "mine:1"}, pod).options.coordinator, "mine:1");
}

// The coordinator grants the epoch: a manager never takes one from a flag when it has one, and
// the error says where the coordinator came from.
TEST(ManagerCommandLine, AnEpochIsRefusedWithACoordinatorWhereverItCameFrom) {
  const std::string refused = "--epoch cannot be given with --coordinator";
  std::string e = Error({"--epoch", "5", "--coordinator", "c:1"});
  EXPECT_NE(e.find(refused), std::string::npos) << e;
  EXPECT_NE(e.find("the coordinator is c:1, from --coordinator"), std::string::npos) << e;
  e = Error({"--epoch", "5"}, {{"REGROUP_COORDINATOR_ADDR", "c:2"}});
  EXPECT_NE(e.find("the coordinator is c:2, from $REGROUP_COORDINATOR_ADDR"), std::string::npos)
      << e;
  e = Error({"--epoch", "5"}, {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                               {"REGROUP_COORDINATOR_CREDENTIAL_FILE", "/token"}});
  EXPECT_NE(e.find(refused), std::string::npos) << e;
  EXPECT_NE(e.find("the coordinator is regroup-coordinator.volcano-system.svc:8899, from a "
                   "Kubernetes pod with a coordinator token"),
            std::string::npos)
      << e;
  EXPECT_EQ(Parse({"--epoch", "5"}).options.epoch, 5) << "standalone, the flag serves";
}

// Issue 40, finding 1: two standalone managers of one job, neither given --record, both trained
// and committed steps, and neither said a word. Without a coordinator a manager needs the durable
// record that fences an older incarnation, or --no-record, which it then warns about.
TEST(ManagerCommandLine, AStandaloneManagerWithoutARecordIsRefusedUnlessItAcceptsTheRisk) {
  const Args job = {"--job-id", "ns/j", "--nodes", "2"};
  const std::string e = Refused(ParseCommandLine(job, EnvOf({})));
  for (const char* named : {"no durable record", "Give --record FILE (or $REGROUP_RECORD_FILE)",
                            "storage that every incarnation of this job reaches",
                            "give --no-record to accept the risk that a second manager trains "
                            "beside this one"})
    EXPECT_NE(e.find(named), std::string::npos) << named << " in: " << e;

  Args accepting = job;
  accepting.push_back("--no-record");
  const CommandLine risky = Ok(ParseCommandLine(accepting, EnvOf({})));
  EXPECT_TRUE(risky.options.no_record);
  ASSERT_EQ(risky.warnings.size(), 1u);
  EXPECT_NE(risky.warnings[0].find("nothing fences another manager of this job"),
            std::string::npos)
      << risky.warnings[0];
  EXPECT_NE(risky.warnings[0].find("Give --record FILE"), std::string::npos) << risky.warnings[0];

  // A record, from the flag or the environment, or a coordinator (its lease fences): no warning.
  Args recorded = job;
  recorded.insert(recorded.end(), {"--record", "/ckpt/record.json"});
  EXPECT_TRUE(Ok(ParseCommandLine(recorded, EnvOf({}))).warnings.empty());
  EXPECT_TRUE(
      Ok(ParseCommandLine(job, EnvOf({{"REGROUP_RECORD_FILE", "/ckpt/r.json"}}))).warnings.empty());
  Args coordinated = job;
  coordinated.insert(coordinated.end(), {"--coordinator", "c:1"});
  EXPECT_TRUE(Ok(ParseCommandLine(coordinated, EnvOf({}))).warnings.empty());
  EXPECT_TRUE(Ok(ParseCommandLine(job, EnvOf({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                              {"REGROUP_COORDINATOR_CREDENTIAL_FILE", "/t"}})))
                  .warnings.empty());
  coordinated.push_back("--no-record");
  const CommandLine moot = Ok(ParseCommandLine(coordinated, EnvOf({})));
  EXPECT_TRUE(moot.warnings.empty());
  ASSERT_EQ(moot.notices.size(), 1u);
  EXPECT_NE(moot.notices[0].find("the flag changes nothing"), std::string::npos);

  // Both: which one was meant is not guessed.
  recorded.push_back("--no-record");
  EXPECT_NE(Refused(ParseCommandLine(recorded, EnvOf({})))
                .find("--no-record cannot be given with a record (/ckpt/record.json"),
            std::string::npos);
  EXPECT_NE(Refused(ParseCommandLine(accepting, EnvOf({{"REGROUP_RECORD_FILE", "/r.json"}})))
                .find("--no-record cannot be given with a record (/r.json"),
            std::string::npos);
}

TEST(ManagerJobSpec, TheFlagsGiveTheJobWithoutAFile) {
  const JobSpec spec = Job({"--job-id", "ns/j", "--nodes", "4", "--nproc-per-node", "2", "--label",
                            "fault-scheduling=force", "--annotation", "recover-strategy=a=b",
                            "--env", "MINDIO_WAIT_MINDX_TIME=60"});
  EXPECT_EQ(spec.id, "ns/j");
  EXPECT_EQ(spec.pods, 4);
  EXPECT_EQ(spec.processes_per_pod, 2);
  EXPECT_EQ(spec.labels, (std::map<std::string, std::string>{{"fault-scheduling", "force"}}));
  EXPECT_EQ(spec.annotations, (std::map<std::string, std::string>{{"recover-strategy", "a=b"}}))
      << "the value runs from the first '=' on";
  EXPECT_EQ(spec.env, (std::map<std::string, std::string>{{"MINDIO_WAIT_MINDX_TIME", "60"}}));
}

TEST(ManagerJobSpec, TheIdFallsBackToRegroupJobIdThenMindxTaskId) {
  EXPECT_EQ(Job({"--nodes", "1"}, {{"REGROUP_JOB_ID", "r"}, {"MINDX_TASK_ID", "m"}}).id, "r");
  EXPECT_EQ(Job({"--nodes", "1"}, {{"MINDX_TASK_ID", "m"}}).id, "m");
  EXPECT_EQ(Job({"--nodes", "1", "--job-id", "f"}, {{"REGROUP_JOB_ID", "r"}}).id, "f");
}

TEST(ManagerJobSpec, WithoutAnIdOrPodsItSaysHowToGiveTheJob) {
  const std::string how = "give the job with --job, or --job-id (or $MINDX_TASK_ID) and --nodes";
  EXPECT_EQ(JobError({"--nodes", "2"}), how);
  EXPECT_EQ(JobError({"--job-id", "ns/j"}), how);
}

TEST(ManagerJobSpec, AKeyValueFlagWithoutAKeyNamesTheFlagAndTheValue) {
  EXPECT_EQ(JobError({"--job-id", "j", "--nodes", "1", "--label", "no-equals"}),
            "--label \"no-equals\" is not KEY=VALUE: give a non-empty key, '=' and the value");
  EXPECT_NE(JobError({"--job-id", "j", "--nodes", "1", "--annotation", "=v"})
                .find("--annotation \"=v\" is not KEY=VALUE"),
            std::string::npos);
  EXPECT_NE(JobError({"--job-id", "j", "--nodes", "1", "--env", "X"}).find("--env \"X\""),
            std::string::npos);
}

TEST_F(ManagerJobFile, TheFlagsOverrideTheJobFile) {
  const std::string path =
      Write("job.json", R"({"id": "file/j", "pods": 4, "processes_per_pod": 2,
                            "labels": {"fault-scheduling": "force"}})");
  JobSpec spec = Job({"--job", path});
  EXPECT_EQ(spec.id, "file/j");
  EXPECT_EQ(spec.pods, 4);
  EXPECT_EQ(spec.processes_per_pod, 2);
  EXPECT_EQ(spec.labels.at("fault-scheduling"), "force");
  spec = Job({"--job", path, "--job-id", "flag/j", "--nodes", "8", "--nproc-per-node", "1",
              "--label", "fault-scheduling=off"},
             {{"REGROUP_JOB_ID", "env/j"}});
  EXPECT_EQ(spec.id, "flag/j");
  EXPECT_EQ(spec.pods, 8);
  EXPECT_EQ(spec.processes_per_pod, 1);
  EXPECT_EQ(spec.labels.at("fault-scheduling"), "off");
  EXPECT_EQ(Job({"--job", path}, {{"REGROUP_JOB_ID", "env/j"}}).id, "file/j")
      << "the file's id comes before the environment's";
}

TEST_F(ManagerJobFile, AJobFileThatCannotBeReadOrParsedIsNamed) {
  const std::string missing = (dir_ / "missing.yaml").string();
  EXPECT_EQ(JobError({"--job", missing}), "--job: cannot read " + missing);
  const std::string torn = Write("torn.json", R"({"id": "j")");
  const std::string e = JobError({"--job", torn});
  EXPECT_EQ(e.find("--job " + torn + ": "), 0u) << e;
}

TEST(ManagerKeysSource, NamesTheFileTheFlagsOrNowhere) {
  ManagerOptions o;
  EXPECT_EQ(KeysSource(o), "nowhere (no --job, --label or --annotation)");
  o.annotations = {"a=b"};
  EXPECT_EQ(KeysSource(o), "--label/--annotation");
  o.keys_source = "the Kubernetes API: Job ns/j";
  EXPECT_EQ(KeysSource(o), "the Kubernetes API: Job ns/j");
  o.job_file = "job.yaml";
  EXPECT_EQ(KeysSource(o), "the job file job.yaml");
}

}  // namespace
}  // namespace regroup::manager
