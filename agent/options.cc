// SPDX-License-Identifier: Apache-2.0
#include "agent/options.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <random>

#include "agent/process.h"
#include "common/address.h"
#include "common/log_format.h"

namespace regroup::agent {
namespace {

enum class Kind {
  kAgent,    // the agent's own option
  kTorch,    // a torchrun flag the agent honours
  kIgnored,  // a torchrun flag accepted and ignored with a notice
};

struct Flag {
  const char* name;  // canonical, with dashes
  Kind kind;
  bool takes_value;
  const char* why_ignored = "";
};

// Names are compared after turning '_' into '-', so --nproc_per_node and --nproc-per-node are
// the same flag (torchrun accepts both spellings).
constexpr Flag kFlags[] = {
    {"manager", Kind::kAgent, true},
    {"job-id", Kind::kAgent, true},
    {"pod-uid", Kind::kAgent, true},
    {"pod-name", Kind::kAgent, true},
    {"node-name", Kind::kAgent, true},
    {"host", Kind::kAgent, true},
    {"socket-dir", Kind::kAgent, true},
    {"credential-file", Kind::kAgent, true},
    {"tls-ca", Kind::kAgent, true},
    {"tls-server-name", Kind::kAgent, true},
    {"tls-cert", Kind::kAgent, true},
    {"tls-key", Kind::kAgent, true},
    {"reconnect-timeout-s", Kind::kAgent, true},
    {"stop-grace-s", Kind::kAgent, true},
    {"connect-timeout-s", Kind::kAgent, true},
    {"python", Kind::kAgent, true},
    {"log-level", Kind::kAgent, true},
    {"log-format", Kind::kAgent, true},
    {"warm-start", Kind::kAgent, true},
    {"warm-imports", Kind::kAgent, true},
    {"help", Kind::kAgent, false},
    {"version", Kind::kAgent, false},
    {"nnodes", Kind::kTorch, true},
    {"nproc-per-node", Kind::kTorch, true},
    {"node-rank", Kind::kTorch, true},
    {"master-addr", Kind::kTorch, true},
    {"master-port", Kind::kTorch, true},
    {"module", Kind::kTorch, false},
    {"no-python", Kind::kTorch, false},
    {"standalone", Kind::kIgnored, false, "the Regroup manager forms the job"},
    {"max-restarts", Kind::kIgnored, true, "the Regroup manager decides restarts"},
    {"monitor-interval", Kind::kIgnored, true, "child exits are detected at once"},
    {"redirects", Kind::kIgnored, true, "trainer output goes to the agent's stdout and stderr"},
    {"tee", Kind::kIgnored, true, "trainer output goes to the agent's stdout and stderr"},
    {"role", Kind::kIgnored, true, "all trainers have one role"},
    {"start-method", Kind::kIgnored, true, "trainers are started with fork and exec"},
    {"log-dir", Kind::kIgnored, true, "trainer output goes to the agent's stdout and stderr"},
    {"local-addr", Kind::kIgnored, true, "use --host"},
    {"logs-specs", Kind::kIgnored, true, "trainer output goes to the agent's stdout and stderr"},
    {"local-ranks-filter", Kind::kIgnored, true,
     "trainer output goes to the agent's stdout and stderr"},
    {"run-path", Kind::kIgnored, false, "the script is run by the interpreter"},
};

constexpr char kRdzvWhy[] = "the Regroup manager does the rendezvous";

std::string Canonical(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

StatusOr<long> ParseInteger(const std::string& text, long min, long max, const std::string& what,
                            const std::string& allowed) {
  long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max)
    return InvalidArgument(what + " \"" + text + "\" is not valid: " + allowed);
  return value;
}

// A dotted Python module name: identifiers of ASCII letters, digits and '_' joined by '.'.
bool IsModuleName(const std::string& name) {
  if (name.empty() || name.size() > 256) return false;
  bool at_start = true;
  for (char c : name) {
    if (c == '.') {
      if (at_start) return false;
      at_start = true;
      continue;
    }
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && !at_start)) return false;
    at_start = false;
  }
  return !at_start;
}

class Parser {
 public:
  explicit Parser(const EnvLookup& env) : env_(env) {}

  StatusOr<CommandLine> Parse(const std::vector<std::string>& args) {
    REGROUP_RETURN_IF_ERROR(ApplyEnvironment());
    size_t i = 0;
    for (; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg == "--") {
        ++i;
        break;
      }
      if (arg.size() < 2 || arg[0] != '-') break;  // the script
      std::string name;
      std::optional<std::string> value;
      if (arg[1] == '-') {
        std::string_view body = std::string_view(arg).substr(2);
        size_t eq = body.find('=');
        name = Canonical(body.substr(0, eq));
        if (eq != std::string_view::npos) value = std::string(body.substr(eq + 1));
      } else if (arg == "-m") {
        name = "module";
      } else if (arg == "-h") {
        name = "help";
      } else if (arg == "-r" || arg == "-t") {
        name = arg == "-r" ? "redirects" : "tee";
      } else {
        return InvalidArgument("unknown flag " + arg + ": see regroup-agent --help");
      }
      const Flag* flag = Find(name);
      Flag rdzv{"rdzv", Kind::kIgnored, true, kRdzvWhy};
      if (flag == nullptr && name.rfind("rdzv-", 0) == 0) flag = &rdzv;
      if (flag == nullptr)
        return InvalidArgument("unknown flag " + arg + ": see regroup-agent --help");
      const std::string shown = arg.substr(0, arg.find('='));
      if (flag->takes_value && !value) {
        if (i + 1 >= args.size()) return InvalidArgument("flag " + shown + " needs a value");
        value = args[++i];
      } else if (!flag->takes_value && value) {
        return InvalidArgument("flag " + shown + " takes no value (got \"" + *value + "\")");
      }
      if (flag->kind == Kind::kIgnored) {
        out_.notices.push_back("torchrun flag " + shown + (value ? "=" + *value : "") +
                               " ignored: " + flag->why_ignored);
        continue;
      }
      REGROUP_RETURN_IF_ERROR(Set(name, value.value_or(""), "flag " + shown));
      if (out_.help || out_.version) return out_;
    }
    for (; i < args.size(); ++i) out_.options.script.push_back(args[i]);
    return Finish();
  }

 private:
  static const Flag* Find(const std::string& name) {
    for (const Flag& flag : kFlags)
      if (name == flag.name) return &flag;
    return nullptr;
  }

  std::optional<std::string> Env(const char* name) const {
    auto value = env_(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }

  // Environment fallbacks, lowest priority first; flags given later override them.
  Status ApplyEnvironment() {
    struct Fallback {
      const char* variable;
      const char* option;
    };
    constexpr Fallback kFallbacks[] = {
        {"REGROUP_MANAGER_ADDR", "manager"},
        {"MINDX_TASK_ID", "job-id"},
        {"REGROUP_JOB_ID", "job-id"},
        {"REGROUP_POD_UID", "pod-uid"},
        {"HOSTNAME", "pod-name"},
        {"REGROUP_POD_NAME", "pod-name"},
        {"REGROUP_NODE_NAME", "node-name"},
        {"REGROUP_HOST", "host"},
        {"REGROUP_SOCKET_DIR", "socket-dir"},
        {"REGROUP_TLS_CA_FILE", "tls-ca"},
        {"REGROUP_TLS_SERVER_NAME", "tls-server-name"},
        {"REGROUP_TLS_CERT_FILE", "tls-cert"},
        {"REGROUP_TLS_KEY_FILE", "tls-key"},
        {"REGROUP_RECONNECT_TIMEOUT_S", "reconnect-timeout-s"},
        {"REGROUP_STOP_GRACE_S", "stop-grace-s"},
        {"REGROUP_CONNECT_TIMEOUT_S", "connect-timeout-s"},
        {"PYTHON", "python"},
        {"REGROUP_LOG_LEVEL", "log-level"},
        {"REGROUP_LOG_FORMAT", "log-format"},
        {"REGROUP_WARM_START", "warm-start"},
        {"REGROUP_WARM_IMPORTS", "warm-imports"},
        {"PET_NNODES", "nnodes"},
        {"PET_NPROC_PER_NODE", "nproc-per-node"},
        // The engine's pod index is the node rank: in a Volcano Job's pod, its index in its task
        // (set by Volcano's job controller), unless torchrun's variable or the flag says otherwise.
        {"VC_TASK_INDEX", "node-rank"},
        {"PET_NODE_RANK", "node-rank"},
        {"PET_MASTER_ADDR", "master-addr"},
        {"PET_MASTER_PORT", "master-port"},
    };
    for (const Fallback& f : kFallbacks)
      if (auto value = Env(f.variable))
        REGROUP_RETURN_IF_ERROR(Set(f.option, *value, std::string("environment variable ") +
                                                          f.variable));
    return Status::Ok();
  }

  Status Set(const std::string& name, const std::string& value, const std::string& what) {
    AgentOptions& o = out_.options;
    auto text = [&](std::string* field) {
      if (value.empty()) return InvalidArgument(what + " needs a non-empty value");
      *field = value;
      return Status::Ok();
    };
    auto integer = [&](int* field, long min, long max, const std::string& allowed) {
      auto parsed = ParseInteger(value, min, max, what, allowed);
      if (!parsed.ok()) return parsed.status();
      *field = static_cast<int>(*parsed);
      return Status::Ok();
    };
    if (name == "manager") {
      manager_given_ = true;
      return text(&o.manager_addr);
    }
    if (name == "job-id") return text(&o.job_id);
    if (name == "pod-uid") return text(&o.pod_uid);
    if (name == "pod-name") return text(&o.pod_name);
    if (name == "node-name") return text(&o.node_name);
    if (name == "host") return text(&o.host);
    if (name == "socket-dir") return text(&o.socket_dir);
    if (name == "credential-file") return text(&o.credential_file);
    if (name == "tls-ca") return text(&o.tls_ca_file);
    if (name == "tls-server-name") return text(&o.tls_server_name);
    if (name == "tls-cert") return text(&o.tls_cert_file);
    if (name == "tls-key") return text(&o.tls_key_file);
    if (name == "python") return text(&o.python);
    if (name == "reconnect-timeout-s")
      return integer(&o.reconnect_timeout_s, 1, 86400, "seconds, an integer from 1 to 86400");
    if (name == "stop-grace-s")
      return integer(&o.stop_grace_s, 0, 3600, "seconds, an integer from 0 to 3600");
    if (name == "connect-timeout-s")
      return integer(&o.connect_timeout_s, 1, 86400, "seconds, an integer from 1 to 86400");
    if (name == "log-level") {
      constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
      for (const char* level : kLevels)
        if (value == level) return text(&o.log_level);
      return InvalidArgument(what + " \"" + value +
                             "\" is not valid: one of trace, debug, info, warn, error, off");
    }
    if (name == "log-format") {
      if (auto format = ParseLogFormat(value); !format.ok())
        return InvalidArgument(what + " " + format.status().message());
      return text(&o.log_format);
    }
    if (name == "warm-start") {
      if (value != "on" && value != "off")
        return InvalidArgument(what + " \"" + value + "\" is not valid: on or off");
      o.warm_start = value == "on";
      return Status::Ok();
    }
    if (name == "warm-imports") {
      std::vector<std::string> modules;
      size_t start = 0;
      for (;;) {
        const size_t comma = value.find(',', start);
        std::string module =
            value.substr(start, comma == std::string::npos ? comma : comma - start);
        if (!IsModuleName(module))
          return InvalidArgument(what + " \"" + value + "\" is not valid: \"" + module +
                                 "\" is not a Python module name (a comma-separated list of "
                                 "dotted names, such as torch,torch.distributed,mymodel)");
        modules.push_back(std::move(module));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      o.warm_imports = std::move(modules);
      return Status::Ok();
    }
    if (name == "help") {
      out_.help = true;
      return Status::Ok();
    }
    if (name == "version") {
      out_.version = true;
      return Status::Ok();
    }
    if (name == "nnodes") {
      const std::string allowed = "N or MIN:MAX, positive integers with MIN <= MAX";
      size_t colon = value.find(':');
      auto min = ParseInteger(value.substr(0, colon), 1, 1 << 20, what, allowed);
      auto max = colon == std::string::npos
                     ? min
                     : ParseInteger(value.substr(colon + 1), 1, 1 << 20, what, allowed);
      if (!min.ok() || !max.ok() || *min > *max)
        return InvalidArgument(what + " \"" + value + "\" is not valid: " + allowed);
      o.nnodes_min = static_cast<int>(*min);
      o.nnodes_max = static_cast<int>(*max);
      return Status::Ok();
    }
    if (name == "nproc-per-node")
      return integer(&o.nproc, 1, 1024,
                     "a positive integer (regroup-agent does not count devices: give the number)");
    if (name == "node-rank") {
      node_rank_from_ = what;
      return integer(&o.node_rank, 0, 1 << 20, "an integer >= 0");
    }
    if (name == "master-addr") {
      master_given_ = true;
      return text(&o.master_addr);
    }
    if (name == "master-port") return integer(&o.master_port, 1, 65535, "a port from 1 to 65535");
    if (name == "module") {
      o.module = true;
      return Status::Ok();
    }
    if (name == "no-python") {
      o.no_python = true;
      return Status::Ok();
    }
    return InvalidArgument("unknown option " + name);  // unreachable: every name is handled
  }

  StatusOr<CommandLine> Finish() {
    AgentOptions& o = out_.options;
    if (o.script.empty())
      return InvalidArgument(
          "no training script given: regroup-agent [options] SCRIPT [ARGS...] (see --help)");
    if (o.module && o.no_python)
      return InvalidArgument("flags -m/--module and --no-python cannot be used together");
    if (o.node_rank >= o.nnodes_max)
      return InvalidArgument(node_rank_from_ + " " + std::to_string(o.node_rank) +
                             " is not below --nnodes " + std::to_string(o.nnodes_max));
    if (o.node_rank < 0 && o.nnodes_max == 1) o.node_rank = 0;  // torchrun's default
    if (o.no_python) o.warm_start = false;  // nothing to import: the script is a program
    // No manager named: it is where MindCluster's layout puts it, on rank 0's pod at
    // $MASTER_ADDR (else the --master-addr given), port 9601.
    if (!manager_given_) {
      const std::optional<std::string> master = Env("MASTER_ADDR");
      const std::string host = master ? *master : master_given_ ? o.master_addr : "127.0.0.1";
      o.manager_addr = (host.find(':') != std::string::npos && host.front() != '['
                            ? "[" + host + "]"
                            : host) +
                       ":9601";
    }
    // Checked as the manager checks its own: 127.0.0.1:P+65536 must not reach port P.
    if (manager_given_) REGROUP_RETURN_IF_ERROR(CheckHostPort(o.manager_addr, "--manager", false));
    // A server name alone would be ignored and the connection left plaintext.
    if (!o.tls_server_name.empty() && o.tls_ca_file.empty())
      return InvalidArgument("flag --tls-server-name (or REGROUP_TLS_SERVER_NAME) " +
                             o.tls_server_name +
                             " needs --tls-ca (or REGROUP_TLS_CA_FILE): the manager's CA bundle");
    if ((!o.tls_cert_file.empty() || !o.tls_key_file.empty()) &&
        (o.tls_ca_file.empty() || o.tls_cert_file.empty() || o.tls_key_file.empty()))
      return InvalidArgument("flags --tls-cert and --tls-key (or REGROUP_TLS_CERT_FILE, "
                             "REGROUP_TLS_KEY_FILE), the agent's own certificate for a manager "
                             "that requires one, go together and need --tls-ca");
    return out_;
  }

  const EnvLookup& env_;
  CommandLine out_;
  bool manager_given_ = false;  // --manager or REGROUP_MANAGER_ADDR
  std::string node_rank_from_;  // where the node rank came from, for errors
  bool master_given_ = false;   // --master-addr or PET_MASTER_ADDR
};

}  // namespace

StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                       const EnvLookup& env) {
  return Parser(env).Parse(args);
}

std::string RandomUid() {
  std::random_device device;
  std::uniform_int_distribution<int> byte(0, 255);
  unsigned char b[16];
  for (auto& x : b) x = static_cast<unsigned char>(byte(device));
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back(kHex[b[i] & 0xf]);
  }
  return out;
}

std::optional<std::string> FirstNonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  freeifaddrs(list);
  return found;
}

void ResolveDefaults(AgentOptions& options, const EnvLookup& env) {
  if (options.pod_uid.empty()) options.pod_uid = RandomUid();
  char hostname[256] = {};
  if (gethostname(hostname, sizeof hostname - 1) != 0) hostname[0] = '\0';
  if (options.pod_name.empty()) options.pod_name = hostname;
  if (options.node_name.empty()) options.node_name = hostname;
  if (options.host.empty()) {
    if (options.node_rank == 0) {
      options.host = options.master_addr;
    } else {
      options.host = FirstNonLoopbackIpv4().value_or("127.0.0.1");
    }
  }
  if (options.socket_dir.empty()) {
    std::string tmp = env("TMPDIR").value_or("");
    if (tmp.empty()) tmp = "/tmp";
    while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
    options.socket_dir = tmp + "/regroup-" + options.pod_uid;
  }
}

Status CheckResolved(const AgentOptions& options, const EnvLookup& env) {
  const std::string socket_path = options.socket_dir + "/agent.sock";
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    return InvalidArgument("flag --socket-dir: the trainer socket " + socket_path +
                           " is longer than " + std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                           " bytes, too long for a Unix socket: give a shorter directory");
  auto executable = FindExecutable(TrainerArgv(options)[0], env("PATH").value_or(""));
  if (!executable.ok())
    return InvalidArgument(
        std::string(options.no_python ? "the training script: " : "flag --python: ") +
        executable.status().message());
  return Status::Ok();
}

std::vector<std::string> TrainerArgv(const AgentOptions& options) {
  std::vector<std::string> argv;
  if (!options.no_python) {
    argv = {options.python, "-u"};
    if (options.module) argv.push_back("-m");
  }
  argv.insert(argv.end(), options.script.begin(), options.script.end());
  return argv;
}

std::vector<std::pair<std::string, std::string>> TrainerEnvironment(
    const AgentOptions& options, int node_rank, uint32_t local_rank,
    const std::string& socket_path, bool omp_num_threads_set) {
  const long node = node_rank < 0 ? 0 : node_rank;
  const long rank = node * options.nproc + local_rank;
  const long world = static_cast<long>(options.nnodes_max) * options.nproc;
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
      {"GROUP_RANK", std::to_string(node)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes_max)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"REGROUP_AGENT_SOCKET", socket_path},
      {"REGROUP_LOCAL_RANK", std::to_string(local_rank)},
      {"REGROUP_JOB_ID", options.job_id},
      {"REGROUP_POD_UID", options.pod_uid},
  };
  if (options.nproc > 1 && !omp_num_threads_set) env.emplace_back("OMP_NUM_THREADS", "1");
  return env;
}

std::string Usage() {
  return R"(regroup-agent: starts a pod's trainer processes and connects them to the job's manager.

Usage: regroup-agent [agent options] [torchrun flags] SCRIPT [ARGS...]
       regroup-agent [agent options] [torchrun flags] -- SCRIPT [ARGS...]

Agent options (environment fallback in brackets):
  --manager HOST:PORT         the job's regroup-manager [REGROUP_MANAGER_ADDR] ($MASTER_ADDR:9601,
                              as MindCluster runs it on rank 0's pod; else --master-addr:9601;
                              else 127.0.0.1:9601)
  --job-id ID                 [REGROUP_JOB_ID, MINDX_TASK_ID]
  --pod-uid UID               this pod's uid [REGROUP_POD_UID] (random)
  --pod-name NAME             [REGROUP_POD_NAME, HOSTNAME]
  --node-name NAME            [REGROUP_NODE_NAME] (hostname)
  --host ADDR                 where peers reach this pod [REGROUP_HOST] (--master-addr on node
                              rank 0, else the first non-loopback IPv4, else 127.0.0.1)
  --socket-dir DIR            the trainer socket's directory [REGROUP_SOCKET_DIR]
                              ($TMPDIR/regroup-<pod uid>)
  --credential-file FILE      the job's credential [REGROUP_CREDENTIAL_FILE, REGROUP_CREDENTIAL]
  --tls-ca FILE               connect to the manager over TLS, trusting this CA bundle (PEM)
                              [REGROUP_TLS_CA_FILE] (plaintext)
  --tls-server-name NAME      the name the manager's certificate must carry, when it is not the
                              host of --manager [REGROUP_TLS_SERVER_NAME] (needs --tls-ca)
  --tls-cert FILE, --tls-key FILE
                              the agent's own certificate and key (PEM), for a manager that
                              requires one (--tls-client-ca) [REGROUP_TLS_CERT_FILE,
                              REGROUP_TLS_KEY_FILE] (needs --tls-ca; none)
  --reconnect-timeout-s S     give up after S seconds without a manager
                              [REGROUP_RECONNECT_TIMEOUT_S] (60)
  --stop-grace-s S            after a stop, wait S seconds for trainers to exit before
                              SIGTERM, then SIGKILL [REGROUP_STOP_GRACE_S] (30)
  --connect-timeout-s S       warn once about a trainer that runs S seconds without connecting
                              to the agent (a script that does not use the regroup library)
                              [REGROUP_CONNECT_TIMEOUT_S] (300)
  --python PATH               the interpreter [PYTHON] (python3)
  --log-level LEVEL           trace, debug, info, warn, error, off [REGROUP_LOG_LEVEL] (info)
  --log-format text|json      json: one object a line (time, level, logger, pod, message)
                              [REGROUP_LOG_FORMAT] (text)
  --warm-start on|off         keep a fork server that has imported the modules below, and start
                              a restarted trainer by forking it instead of a new interpreter
                              [REGROUP_WARM_START] (on; off with --no-python). The script and
                              the modules must not start threads, create an accelerator context
                              or read the rank's variables at import time
  --warm-imports M1,M2        what the fork server imports [REGROUP_WARM_IMPORTS]
                              (torch,torch.distributed,regroup.trainer)
  --version                   print the version and exit

torchrun flags honoured (PET_* environment fallbacks):
  --nnodes N|MIN:MAX  --nproc-per-node N  --node-rank R  --master-addr A  --master-port P
  -m/--module  --no-python
  The node rank is, in order: --node-rank, PET_NODE_RANK, VC_TASK_INDEX (a Volcano Job's pod
  index in its task), else the manager assigns the first free one.
torchrun flags accepted and ignored: --rdzv-*, --standalone, --max-restarts, --monitor-interval,
  --redirects, --tee, --role, --start-method, --log-dir, --local-addr, --logs-specs,
  --local-ranks-filter, --run-path

Exit status: 0 training done, left or dumped; 1 stopped by the manager or the manager was gone
longer than the reconnect timeout; 2 a bad command line; 3 a trainer failed before any trainer
connected to the agent: the script does not use the regroup library, which Regroup cannot
recover (the agent says so with the five lines that adopt it, stops the other trainers, leaves
and restarts nothing).
)";
}

}  // namespace regroup::agent
