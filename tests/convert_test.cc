// SPDX-License-Identifier: Apache-2.0
// regroupctl convert: a MindCluster AscendJob into the Volcano Job for Regroup.
#include <algorithm>

#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "cli/convert.h"
#include "common/version.h"
#include "plugin/volcano_job.h"
#include "tests/source_file.h"

namespace regroup::cli {
namespace {

std::string Read(const std::string& rel) { return testing::ReadSourceFile(rel); }

ConvertResult MustConvert(const std::string& yaml, const ConvertOptions& options = {}) {
  auto result = ConvertAscendJob(yaml, options);
  EXPECT_TRUE(result.ok()) << result.status().message();
  if (!result.ok()) return {};
  return std::move(*result);
}

std::string ConvertError(const std::string& yaml) {
  auto result = ConvertAscendJob(yaml, ConvertOptions{});
  EXPECT_FALSE(result.ok());
  return result.ok() ? "" : result.status().message();
}

std::vector<std::string> Strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const auto& item : list) out.push_back(item.Scalar());
  return out;
}

// The env of a container as name -> value (or "fieldRef:PATH").
std::map<std::string, std::string> Env(const YAML::Node& container) {
  std::map<std::string, std::string> out;
  for (const auto& e : container["env"]) {
    if (e["value"]) out[e["name"].Scalar()] = e["value"].Scalar();
    else if (e["valueFrom"]["fieldRef"])
      out[e["name"].Scalar()] = "fieldRef:" + e["valueFrom"]["fieldRef"]["fieldPath"].Scalar();
    else out[e["name"].Scalar()] = "";
  }
  return out;
}

bool HasNote(const ConvertResult& r, ConvertNote::Kind kind, const std::string& field,
             const std::string& message) {
  for (const auto& n : r.notes)
    if (n.kind == kind && n.field == field && n.message == message) return true;
  return false;
}

std::string Notes(const ConvertResult& r) { return FormatReport(r, "job.yaml"); }

// A minimal AscendJob; `extra` goes under the Worker's first container.
std::string Job(const std::string& labels, const std::string& annotations,
                const std::string& worker_container_extra, int workers = 2) {
  return R"(apiVersion: mindxdl.gitee.com/v1
kind: AscendJob
metadata:
  name: small
  labels:
    framework: pytorch
)" + labels + R"(
  annotations:
    note: "x"
)" + annotations + R"(
spec:
  replicaSpecs:
    Worker:
      replicas: )" + std::to_string(workers) + R"(
      template:
        spec:
          containers:
            - name: trainer
              image: train:latest
              resources: {limits: {nvidia.com/gpu: 2}}
)" + worker_container_extra + "\n";
}

TEST(Convert, ElasticExampleBecomesTheVolcanoJobForRegroup) {
  const std::string input = Read("examples/mindcluster/pytorch-elastic-910b.yaml");
  ConvertResult r = MustConvert(input);
  ASSERT_TRUE(r.resolved.ok()) << Notes(r);
  EXPECT_TRUE(r.resolved.problems.empty()) << Notes(r);
  const YAML::Node in = YAML::Load(input);
  const YAML::Node out = YAML::Load(r.yaml);

  EXPECT_EQ(out["apiVersion"].Scalar(), "batch.volcano.sh/v1alpha1");
  EXPECT_EQ(out["kind"].Scalar(), "Job");
  EXPECT_EQ(out["metadata"]["name"].Scalar(), "llama-pretrain");
  EXPECT_EQ(out["metadata"]["namespace"].Scalar(), "training");
  // MindCluster's labels and annotations, every one unchanged and still a string; and
  // runPolicy.backoffLimit, which bounds every rescheduling as in MindCluster.
  EXPECT_EQ(out["metadata"]["annotations"]["regroup.io/backoff-limit"].Scalar(), "3");
  for (const char* field : {"labels", "annotations"}) {
    ASSERT_EQ(out["metadata"][field].size(),
              in["metadata"][field].size() + (std::string(field) == "annotations" ? 1 : 0))
        << field;
    for (const auto& kv : in["metadata"][field]) {
      const YAML::Node v = out["metadata"][field][kv.first.Scalar()];
      EXPECT_EQ(v.Scalar(), kv.second.Scalar()) << kv.first.Scalar();
      EXPECT_EQ(v.Tag(), "!") << kv.first.Scalar() << " must be written as a quoted string";
    }
  }
  const YAML::Node spec = out["spec"];
  EXPECT_EQ(spec["schedulerName"].Scalar(), "volcano");
  EXPECT_EQ(spec["minAvailable"].as<int>(), 3);  // 2 pods for min-data-parallel 2 + manager
  EXPECT_EQ(spec["queue"].Scalar(), "default");
  EXPECT_EQ(spec["maxRetry"].as<int>(), 3);
  ASSERT_TRUE(spec["plugins"]["svc"].IsSequence());
  ASSERT_TRUE(spec["plugins"]["env"].IsSequence()) << "VC_TASK_INDEX gives each agent its node rank";
  ASSERT_EQ(spec["tasks"].size(), 2u);

  const YAML::Node manager = spec["tasks"][0];
  EXPECT_EQ(manager["name"].Scalar(), "manager");
  EXPECT_EQ(manager["replicas"].as<int>(), 1);
  EXPECT_FALSE(manager["policies"]) << "a Restart* policy counts faults against maxRetry";
  const YAML::Node mc = manager["template"]["spec"]["containers"][0];
  EXPECT_EQ(manager["template"]["spec"]["restartPolicy"].Scalar(), "OnFailure");
  EXPECT_EQ(mc["image"].Scalar(), "regroup/regroup:" REGROUP_VERSION_STRING);
  EXPECT_EQ(Strings(mc["command"]),
            (std::vector<std::string>{
                "regroup-manager", "--job-id", "$(REGROUP_NAMESPACE)/llama-pretrain", "--nodes",
                "4", "--nproc-per-node", "8", "--listen", "0.0.0.0:9601", "--coordinator-ca",
                "/etc/regroup/tls/ca.crt", "--label",
                "fault-retry-times=10", "--label", "fault-scheduling=force", "--label",
                "pod-rescheduling=on", "--label", "process-recover-enable=on", "--annotation",
                "recover-strategy=retry,recover-in-place,recover,elastic-training,dump",
                "--annotation", "regroup.io/backoff-limit=3", "--annotation",
                "regroup.io/global-batch-size=512", "--annotation",
                "regroup.io/micro-batch-size=4", "--annotation", "regroup.io/min-data-parallel=2",
                "--annotation", "regroup.io/pipeline-parallel=2", "--annotation",
                "regroup.io/tensor-parallel=4", "--annotation", "wait-reschedule-timeout=60",
                "--env", "MINDIO_WAIT_MINDX_TIME=60"}));
  EXPECT_EQ(Env(mc), (std::map<std::string, std::string>{
                         {"REGROUP_NAMESPACE", "fieldRef:metadata.namespace"},
                         {"REGROUP_CREDENTIAL_FILE", "/etc/regroup/credential/token"},
                         {"REGROUP_COORDINATOR_ADDR",
                          "regroup-coordinator.volcano-system.svc:8899"},
                         {"REGROUP_COORDINATOR_CREDENTIAL_FILE",
                          "/etc/regroup/coordinator/token"}}));
  // The coordinator takes the job's own token there, never the cluster key.
  EXPECT_EQ(manager["template"]["spec"]["volumes"][1]["secret"]["secretName"].Scalar(),
            "llama-pretrain-regroup-coordinator-token");
  EXPECT_EQ(mc["volumeMounts"][1]["mountPath"].Scalar(), "/etc/regroup/coordinator");
  // The chart's coordinator serves TLS: the manager checks it with the CA of the job's TLS
  // Secret (cert-manager's layout), ca.crt alone. Without it the converted manager could never
  // attach (issue 39: the converted seed job on the real control plane).
  EXPECT_EQ(mc["volumeMounts"][2]["mountPath"].Scalar(), "/etc/regroup/tls");
  const YAML::Node tls = manager["template"]["spec"]["volumes"][2];
  EXPECT_EQ(tls["name"].Scalar(), mc["volumeMounts"][2]["name"].Scalar());
  EXPECT_EQ(tls["secret"]["secretName"].Scalar(), "llama-pretrain-regroup-tls");
  ASSERT_EQ(tls["secret"]["items"].size(), 1u);
  EXPECT_EQ(tls["secret"]["items"][0]["key"].Scalar(), "ca.crt");
  EXPECT_EQ(tls["secret"]["items"][0]["path"].Scalar(), "ca.crt");
  EXPECT_EQ(mc["ports"][0]["name"].Scalar(), "taskd-port");
  EXPECT_EQ(mc["ports"][0]["containerPort"].as<int>(), 9601);
  EXPECT_EQ(mc["resources"]["requests"]["cpu"].Scalar(), "1");
  EXPECT_EQ(mc["resources"]["limits"].size(), 2u);  // cpu and memory: no accelerator
  EXPECT_EQ(manager["template"]["spec"]["volumes"][0]["secret"]["secretName"].Scalar(),
            "llama-pretrain-regroup-credential");
  EXPECT_EQ(manager["template"]["metadata"]["labels"]["regroup.io/role"].Scalar(), "manager");

  // Master (1) and Worker (3) have the same template: one task of four pods.
  const YAML::Node worker = spec["tasks"][1];
  EXPECT_EQ(worker["name"].Scalar(), "worker");
  EXPECT_EQ(worker["replicas"].as<int>(), 4);
  EXPECT_EQ(worker["policies"][0]["event"].Scalar(), "TaskCompleted");
  EXPECT_EQ(worker["policies"][0]["action"].Scalar(), "CompleteJob");
  const YAML::Node pod = worker["template"]["spec"];
  EXPECT_EQ(pod["restartPolicy"].Scalar(), "Never");
  EXPECT_EQ(worker["template"]["metadata"]["labels"]["job-name"].Scalar(), "llama-pretrain");
  EXPECT_EQ(worker["template"]["metadata"]["labels"]["ring-controller.atlas"].Scalar(),
            "ascend-910b");
  EXPECT_EQ(pod["nodeSelector"]["accelerator-type"].Scalar(), "module-910b-8");
  const YAML::Node tc = pod["containers"][0];
  EXPECT_EQ(Strings(tc["command"]), (std::vector<std::string>{"/bin/bash", "-c"}));
  EXPECT_EQ(Strings(tc["args"]),
            (std::vector<std::string>{"cd /job/code\nregroup-agent --nproc_per_node 8 --nnodes 4 "
                                      "pretrain_llama.py --config llama-7b.yaml\n"}));
  const auto env = Env(tc);
  EXPECT_EQ(env.at("XDL_IP"), "fieldRef:status.hostIP");
  EXPECT_EQ(env.at("MINDIO_WAIT_MINDX_TIME"), "60");
  EXPECT_EQ(env.at("REGROUP_JOB_ID"), "$(REGROUP_NAMESPACE)/llama-pretrain");
  EXPECT_EQ(env.at("REGROUP_MANAGER_ADDR"), "llama-pretrain-manager-0.llama-pretrain:9601");
  EXPECT_EQ(env.at("REGROUP_POD_UID"), "fieldRef:metadata.uid");
  EXPECT_EQ(env.at("REGROUP_NODE_NAME"), "fieldRef:spec.nodeName");
  EXPECT_EQ(env.at("REGROUP_HOST"), "fieldRef:status.podIP");
  EXPECT_EQ(env.at("REGROUP_CREDENTIAL_FILE"), "/etc/regroup/credential/token");
  EXPECT_EQ(env.at("PET_NNODES"), "4");
  EXPECT_EQ(env.at("PET_NPROC_PER_NODE"), "8");
  // The input already had taskd-port: not added twice.
  ASSERT_EQ(tc["ports"].size(), 2u);
  EXPECT_EQ(tc["ports"][1]["name"].Scalar(), "taskd-port");
  EXPECT_EQ(tc["volumeMounts"][1]["mountPath"].Scalar(), "/etc/regroup/credential");
  EXPECT_EQ(pod["volumes"][1]["secret"]["secretName"].Scalar(),
            "llama-pretrain-regroup-credential");
  EXPECT_EQ(pod["volumes"][1]["secret"]["defaultMode"].as<int>(), 0400);

  // As `regroupctl validate` reads it.
  EXPECT_EQ(r.spec.id, "training/llama-pretrain");
  EXPECT_EQ(r.spec.pods, 4);
  EXPECT_EQ(r.spec.processes_per_pod, 8);
  ASSERT_TRUE(r.spec.volcano);
  EXPECT_EQ(r.spec.volcano->manager_pods, 1);
}

// Issue 40, finding 1: a standalone manager needs a durable record or --no-record. Without a
// coordinator the converter knows no shared storage: it gives --no-record and asks for a record.
TEST(Convert, WithoutACoordinatorTheManagerRunsWithoutARecordAndTheReportAsksForOne) {
  ConvertOptions standalone;
  standalone.coordinator = "";
  ConvertResult r =
      MustConvert(Read("examples/mindcluster/pytorch-elastic-910b.yaml"), standalone);
  const YAML::Node out = YAML::Load(r.yaml);
  const auto command =
      Strings(out["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"]);
  EXPECT_EQ(command.back(), "--no-record");
  bool asked = false;
  for (const auto& n : r.notes)
    asked |= n.kind == ConvertNote::Kind::kCheck &&
             n.message.find("replace --no-record with --record") != std::string::npos;
  EXPECT_TRUE(asked) << "the report must ask for a record";
  // With the coordinator (the default), its lease fences: no flag.
  const auto coordinated = Strings(YAML::Load(MustConvert(Read(
      "examples/mindcluster/pytorch-elastic-910b.yaml")).yaml)["spec"]["tasks"][0]["template"]
                                       ["spec"]["containers"][0]["command"]);
  EXPECT_EQ(std::count(coordinated.begin(), coordinated.end(), "--no-record"), 0);
}

// The coordinator's TLS: another Secret by --tls-secret, none for a plaintext coordinator or
// without a coordinator; the report asks for the Secret it names.
TEST(Convert, TheManagerChecksTheCoordinatorsCertificateUnlessToldItServesPlaintext) {
  const std::string input = Read("examples/mindcluster/pytorch-elastic-910b.yaml");
  auto manager_of = [](const ConvertResult& r) {
    return YAML::Load(r.yaml)["spec"]["tasks"][0]["template"]["spec"];
  };
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  ConvertOptions other;
  other.tls_secret = "cluster-ca";
  ConvertResult named = MustConvert(input, other);
  EXPECT_EQ(manager_of(named)["volumes"][2]["secret"]["secretName"].Scalar(), "cluster-ca");
  bool asked = false;
  for (const auto& n : named.notes)
    asked |= n.kind == ConvertNote::Kind::kCheck && n.field == "Secret cluster-ca" &&
             n.message.find("ca.crt") != std::string::npos;
  EXPECT_TRUE(asked) << Notes(named);
  for (const bool plaintext : {true, false}) {
    ConvertOptions o;
    o.plaintext_coordinator = plaintext;
    if (!plaintext) o.coordinator = "";
    const YAML::Node pod = manager_of(MustConvert(input, o));
    const auto command = Strings(pod["containers"][0]["command"]);
    EXPECT_FALSE(has(command, "--coordinator-ca")) << plaintext;
    for (const auto& v : pod["volumes"])
      EXPECT_NE(v["name"].Scalar(), "regroup-tls") << plaintext;
  }
}

TEST(Convert, ElasticExampleReportSaysWhatChangedAndWhy) {
  ConvertResult r = MustConvert(Read("examples/mindcluster/pytorch-elastic-910b.yaml"));
  using K = ConvertNote::Kind;
  EXPECT_TRUE(HasNote(r, K::kChanged,
                      "spec.runPolicy.schedulingPolicy.minAvailable 4 -> spec.minAvailable 3",
                      "the job's elastic minimum (2 training pods for "
                      "regroup.io/min-data-parallel=2, and the manager): a job scaled in keeps "
                      "running with fewer pods, and Volcano stops a job below minAvailable"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kChanged,
                      "spec.replicaSpecs.Master, spec.replicaSpecs.Worker -> spec.tasks[worker]",
                      "one task of 4 pods: their pod templates are the same, and under Regroup "
                      "rank 0's pod is not special (the manager assigns node ranks)"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kChanged, "spec.tasks[worker].template.spec.containers[0].command",
                      "torchrun -> regroup-agent, rewritten in the command (was: /bin/bash -c cd "
                      "/job/code torchrun "
                      "--nproc_per_node 8 --nnodes 4 pretr...): the agent takes torchrun's flags, "
                      "is the parent of the pod's trainers and connects them to the job's manager"))
      << Notes(r);
  // A manager.py the script keeps steps aside for the manager task: one manager per job.
  EXPECT_TRUE(HasNote(r, K::kKept, "manager.py",
                      "a MindCluster manager.py the pods' script still starts on rank 0 may stay: "
                      "with REGROUP_MANAGER_ADDR naming this task's manager, regroup.api's "
                      "start_taskd_manager starts no second manager of the job and returns"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kDropped, "spec.successPolicy",
                      "no Volcano field: the job completes when its training pods have completed "
                      "(TaskCompleted -> CompleteJob)"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kCheck, "Secret llama-pretrain-regroup-credential",
                      "create it before the job: kubectl create secret generic "
                      "llama-pretrain-regroup-credential -n training "
                      "--from-literal=token=$(openssl rand -hex 32)"))
      << Notes(r);
  const std::string report = Notes(r);
  EXPECT_EQ(report.substr(0, report.find('\n')),
            "job.yaml: converted AscendJob training/llama-pretrain into a Volcano Job: 4 training "
            "pods x 8 processes and a manager");
  EXPECT_NE(report.find("\n  kept    metadata.labels, metadata.annotations: framework, "
                        "ring-controller.atlas, tor-affinity, fault-scheduling, "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("\njob.yaml: the converted job passes `regroupctl validate`\n"),
            std::string::npos);
}

// Every example converts into a job that validates, with minAvailable the largest value the
// validator accepts: one more is refused for an elastic job.
// An elastic job gets its elastic minimum; one more pod is refused unless it is every pod
// (MindCluster's, which the scheduler lowers once the job runs).
TEST(Convert, EveryExampleValidatesAtItsElasticMinimum) {
  for (const char* file : {"examples/mindcluster/pytorch-elastic-910b.yaml",
                           "examples/mindcluster/pytorch-resnet50-910b.yaml",
                           "examples/mindcluster/pytorch-gpu-workers.yaml"}) {
    SCOPED_TRACE(file);
    ConvertResult r = MustConvert(Read(file));
    // The one warning allowed: the plain job's, that recovery is off (the convert's advice).
    const bool plain = !r.resolved.config.recovery_on();
    ASSERT_EQ(r.resolved.problems.size(), plain ? 1u : 0u) << Notes(r);
    if (plain) EXPECT_EQ(r.resolved.problems[0].key, "recover-strategy");
    auto again = JobSpecFromVolcanoYaml(r.yaml);
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_TRUE(again->Resolve().problems.empty());

    YAML::Node out = YAML::Load(r.yaml);
    const int min = out["spec"]["minAvailable"].as<int>();
    const JobConfig c = r.resolved.config;
    const int every_pod = static_cast<int>(r.spec.pods) + 1;  // and the manager
    if (!(c.recovery_on() && c.allows(Strategy::kElasticTraining))) {
      EXPECT_EQ(min, every_pod);
      continue;
    }
    EXPECT_EQ(min, ElasticMinAvailable(c, r.spec.pods, 1));
    const auto problems_at = [&](int m) {
      out["spec"]["minAvailable"] = m;
      auto job = JobSpecFromVolcanoYaml(YAML::Dump(out));
      EXPECT_TRUE(job.ok());
      return job->Resolve().problems;
    };
    EXPECT_TRUE(problems_at(every_pod).empty());
    if (min + 1 < every_pod) {
      const auto problems = problems_at(min + 1);
      ASSERT_EQ(problems.size(), 1u);
      EXPECT_EQ(problems[0].key, "volcano.spec.minAvailable");
    }
  }
}

TEST(Convert, PlainJobNeedsEveryPodAndAsksForTheScriptToBeChanged) {
  ConvertResult r = MustConvert(Read("examples/mindcluster/pytorch-resnet50-910b.yaml"));
  const YAML::Node out = YAML::Load(r.yaml);
  EXPECT_EQ(out["metadata"]["namespace"].IsDefined(), false);
  EXPECT_EQ(out["spec"]["minAvailable"].as<int>(), 3);
  EXPECT_EQ(r.spec.id, "default/default-test-pytorch");
  EXPECT_EQ(r.spec.processes_per_pod, 2);
  using K = ConvertNote::Kind;
  EXPECT_TRUE(HasNote(r, K::kChanged,
                      "spec.runPolicy.schedulingPolicy.minAvailable 2 -> spec.minAvailable 3",
                      "every pod and the manager: without recovery by elastic-training the job "
                      "needs all its pods at once"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kCheck, "spec.tasks[worker].template.spec.containers[0].command",
                      "\"/bin/bash -c cd /job/code/scripts; chmod +x train_start.sh; bash "
                      "train...\" does not start torchrun itself: REGROUP_TORCHRUN=on is set, so "
                      "the torchrun a script of the image runs hands over to regroup-agent with "
                      "the same flags where the image ran `python3 -m regroup.torchrun install` "
                      "(a hook in torch's run.py) or `python3 -m regroup.torchrun shim DIR` (a "
                      "torchrun ahead on PATH); in an image with neither, call regroup-agent "
                      "instead of torchrun"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kCheck,
                      "spec.tasks[worker].template.spec.containers[0].env.ASCEND_VISIBLE_DEVICES",
                      "it reads a pod annotation that MindCluster's Ascend Volcano plugin writes: "
                      "keep that plugin enabled beside regroup, or remove the variable"))
      << Notes(r);
  // The command itself is unchanged, and the torchrun of train_start.sh hands over.
  std::string handover;
  for (const auto& e : out["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["env"])
    if (e["name"].Scalar() == "REGROUP_TORCHRUN") handover = e["value"].Scalar();
  EXPECT_EQ(handover, "on");
  EXPECT_EQ(out["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["args"][0].Scalar(),
            "cd /job/code/scripts; chmod +x train_start.sh; bash train_start.sh /job/code "
            "/job/output main.py --data=/job/data/resnet50/imagenet --amp --arch=resnet50 "
            "--seed=49 -j=128 --lr=1.6 --dist-backend='hccl' --epochs=90 --batch-size=4096");
}

TEST(Convert, OtherDocumentsFollowTheJobUnchanged) {
  ConvertResult r = MustConvert(Read("examples/mindcluster/pytorch-gpu-workers.yaml"));
  const auto docs = YAML::LoadAll(r.yaml);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]["kind"].Scalar(), "Job");
  EXPECT_EQ(docs[1]["kind"].Scalar(), "ConfigMap");
  EXPECT_EQ(docs[1]["data"]["STEP_SLEEP"].Scalar(), "0.05");
  EXPECT_EQ(docs[1]["data"]["STEP_SLEEP"].Tag(), "!");
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kKept, "document 2",
                      "the input's other document (kind ConfigMap) follows the job unchanged"));
  // Exec-form torchrun; ExitCode is the operator's, Never the pod's.
  const YAML::Node c = docs[0]["spec"]["tasks"][1]["template"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(c["command"]), (std::vector<std::string>{"regroup-agent", "--nproc-per-node=4",
                                                             "--nnodes=2", "train_mlp.py"}));
  EXPECT_EQ(Strings(c["args"]), (std::vector<std::string>{"--steps", "1000"}));
  EXPECT_EQ(docs[0]["spec"]["tasks"][1]["template"]["spec"]["restartPolicy"].Scalar(), "Never");
  EXPECT_EQ(docs[0]["spec"]["minAvailable"].as<int>(), 2);
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kChanged,
                      "spec.tasks[worker].template.spec.restartPolicy",
                      "ExitCode -> Never: ExitCode is the Ascend operator's (restart on a "
                      "retryable exit code); under Regroup the manager decides restarts"));
}

TEST(Convert, MasterAndWorkerWithDifferentTemplatesStayTwoTasks) {
  const std::string yaml = R"(apiVersion: mindxdl.gitee.com/v1
kind: AscendJob
metadata: {name: two, labels: {framework: pytorch}}
spec:
  replicaSpecs:
    Worker:
      replicas: 3
      template:
        spec:
          containers: [{name: w, image: train, command: [torchrun, --nproc-per-node=4, t.py],
                        resources: {limits: {nvidia.com/gpu: 4}}}]
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: m, image: train-master, command: [torchrun, --nproc-per-node=4, t.py],
                        resources: {limits: {nvidia.com/gpu: 4}}}]
)";
  ConvertResult r = MustConvert(yaml);
  const YAML::Node tasks = YAML::Load(r.yaml)["spec"]["tasks"];
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(tasks[1]["name"].Scalar(), "master");  // first: rank 0's environment is read there
  EXPECT_EQ(tasks[1]["replicas"].as<int>(), 1);
  EXPECT_FALSE(tasks[1]["policies"].IsDefined());
  EXPECT_EQ(tasks[1]["template"]["spec"]["containers"][0]["image"].Scalar(), "train-master");
  EXPECT_EQ(tasks[2]["name"].Scalar(), "worker");
  EXPECT_EQ(tasks[2]["replicas"].as<int>(), 3);
  EXPECT_EQ(tasks[2]["policies"][0]["action"].Scalar(), "CompleteJob");
  EXPECT_EQ(Env(tasks[1]["template"]["spec"]["containers"][0]).at("PET_NNODES"), "4");
  EXPECT_EQ(r.spec.pods, 4);
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kChanged,
                      "spec.replicaSpecs.Master -> spec.tasks[master]",
                      "1 pod"));
}

TEST(Convert, PythonDashMTorchDistributedRunAcrossCommandAndArgs) {
  ConvertResult r = MustConvert(
      Job("", "", "              command: [python3]\n"
                  "              args: [-m, torch.distributed.run, --nproc-per-node=2, train.py]"));
  const YAML::Node c = YAML::Load(r.yaml)["spec"]["tasks"][1]["template"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(c["command"]), (std::vector<std::string>{"regroup-agent"}));
  EXPECT_EQ(Strings(c["args"]), (std::vector<std::string>{"--nproc-per-node=2", "train.py"}));
}

TEST(Convert, ShellScriptsHaveEveryTorchrunReplacedAndNothingElse) {
  ConvertResult r = MustConvert(Job(
      "", "",
      "              command: [sh, -ec, \"cd /w; /usr/local/bin/torchrun --nnodes 2 a.py || "
      "python -m torch.distributed.run b.py; echo mytorchrun torchrun.log\"]"));
  const YAML::Node c = YAML::Load(r.yaml)["spec"]["tasks"][1]["template"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(c["command"]),
            (std::vector<std::string>{"sh", "-ec",
                                      "cd /w; regroup-agent --nnodes 2 a.py || regroup-agent "
                                      "b.py; echo mytorchrun torchrun.log"}));
}

TEST(Convert, LongScriptsAreScannedWithoutTrouble) {
  std::string filler;
  for (int i = 0; i < 10000; ++i) filler += "echo $(which python3) ; ";  // 240 kB
  ConvertResult r = MustConvert(
      Job("", "", "              command: [bash, -c, \"" + filler +
                      "exec $(command -v torchrun) t.py\"]"));
  const YAML::Node c = YAML::Load(r.yaml)["spec"]["tasks"][1]["template"]["spec"]["containers"][0];
  EXPECT_EQ(c["command"][2].Scalar(), filler + "exec $(command -v regroup-agent) t.py");
}

TEST(Convert, OperatorEnvironmentAndLaunchAreFlagged) {
  ConvertResult r = MustConvert(Job(
      "", "",
      "              command: [bash, -c, \"python -m torch.distributed.launch --master_addr "
      "$MASTER_ADDR t.py\"]"));
  using K = ConvertNote::Kind;
  const std::string at = "spec.tasks[worker].template.spec.containers[0].command";
  EXPECT_TRUE(HasNote(r, K::kCheck, at,
                      "torch.distributed.launch is left as it is: replace it by regroup-agent "
                      "(trainers read LOCAL_RANK from the environment, as with --use-env)"))
      << Notes(r);
  EXPECT_TRUE(HasNote(r, K::kCheck, at,
                      "it uses MASTER_ADDR, MASTER_PORT, NODE_RANK or WORLD_SIZE, which "
                      "MindCluster's operator set and a Volcano Job does not: regroup-agent gives "
                      "the trainers torchrun's variables itself, so drop --master-addr, "
                      "--master-port and --node-rank from its flags"))
      << Notes(r);
}

TEST(Convert, TheUsersOwnSettingsWin) {
  ConvertResult r = MustConvert(Job("", "",
                                    "              env: [{name: REGROUP_MANAGER_ADDR, value: "
                                    "\"mgr:1\"}, {name: PET_NNODES, value: \"7\"}]\n"
                                    "              ports: [{name: taskd-port, "
                                    "containerPort: 9700}]"),
                                ConvertOptions{"my/manager:1", "", "shared-token"});
  const YAML::Node tasks = YAML::Load(r.yaml)["spec"]["tasks"];
  const YAML::Node c = tasks[1]["template"]["spec"]["containers"][0];
  const auto env = Env(c);
  EXPECT_EQ(env.at("REGROUP_MANAGER_ADDR"), "mgr:1");
  EXPECT_EQ(env.at("PET_NNODES"), "7");
  EXPECT_EQ(env.at("PET_NPROC_PER_NODE"), "2");
  ASSERT_EQ(c["ports"].size(), 1u);
  EXPECT_EQ(c["ports"][0]["containerPort"].as<int>(), 9700);
  EXPECT_EQ(tasks[0]["template"]["spec"]["containers"][0]["image"].Scalar(), "my/manager:1");
  EXPECT_EQ(Env(tasks[0]["template"]["spec"]["containers"][0]).count("REGROUP_COORDINATOR_ADDR"),
            0u);
  EXPECT_EQ(tasks[1]["template"]["spec"]["volumes"][0]["secret"]["secretName"].Scalar(),
            "shared-token");
}

TEST(Convert, StringsReadBackExactly) {
  const std::string yaml = Job("    pod-rescheduling: \"on\"\n    fault-scheduling: force",
                               "    wait-reschedule-timeout: \"60\"\n"
                               "    odd: \"t\\tab \\\"q\\\" é\"",
                               "              command: [bash, -c]\n"
                               "              args: [\"echo one\\n  two\\n\\n\", \" lead\"]\n"
                               "              env: [{name: N, value: \"8\"}, "
                               "{name: Y, value: yes}]");
  ConvertResult r = MustConvert(yaml);
  const YAML::Node out = YAML::Load(r.yaml);
  EXPECT_EQ(out["metadata"]["labels"]["pod-rescheduling"].Scalar(), "on");
  EXPECT_EQ(out["metadata"]["labels"]["pod-rescheduling"].Tag(), "!");
  EXPECT_EQ(out["metadata"]["annotations"]["wait-reschedule-timeout"].Tag(), "!");
  EXPECT_EQ(out["metadata"]["annotations"]["odd"].Scalar(), "t\tab \"q\" é");
  const YAML::Node c = out["spec"]["tasks"][1]["template"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(c["args"]), (std::vector<std::string>{"echo one\n  two\n\n", " lead"}));
  EXPECT_EQ(Env(c).at("N"), "8");
  EXPECT_EQ(Env(c).at("Y"), "yes");
  for (const auto& e : c["env"])
    if (e["value"]) {
      EXPECT_EQ(e["value"].Tag(), "!") << e["name"].Scalar();
    }
}

TEST(Convert, UnknownProcessesPerPodAreFlagged) {
  std::string yaml = Job("", "", "              command: [torchrun, t.py]");
  yaml.replace(yaml.find("resources: {limits: {nvidia.com/gpu: 2}}"), 40, "resources: {}");
  ConvertResult r = MustConvert(yaml);
  EXPECT_EQ(r.spec.processes_per_pod, 1);
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kCheck, "processes per pod",
                      "the trainer requests no accelerator (a gpu, npu or Ascend resource) and its "
                      "command gives no --nproc-per-node: one process per pod is assumed; request "
                      "the devices, or set PET_NPROC_PER_NODE"))
      << Notes(r);
  // Given by the flag: nothing to say.
  yaml.replace(yaml.find("[torchrun, t.py]"), 16, "[torchrun, --nproc-per-node=1, t.py]");
  ConvertResult flagged = MustConvert(yaml);
  for (const auto& n : flagged.notes) EXPECT_NE(n.field, "processes per pod");
}

TEST(Convert, AMissingFrameworkIsConvertedAsPyTorchWithANote) {
  std::string yaml = Job("", "", "              command: [torchrun, t.py]");
  yaml.replace(yaml.find("    framework: pytorch\n"), 23, "");
  ConvertResult r = MustConvert(yaml);
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kCheck, "metadata.labels.framework",
                      "no framework label: the job is converted as a PyTorch job (Regroup's "
                      "trainer library is for PyTorch)"));
}

TEST(Convert, BadRegroupKeysConvertButDoNotValidate) {
  ConvertResult r = MustConvert(Job("", "    regroup.io/min-data-parallel: \"zero\"",
                                    "              command: [torchrun, t.py]"));
  ASSERT_FALSE(r.resolved.ok());
  EXPECT_NE(Notes(r).find("job.yaml: error: annotation regroup.io/min-data-parallel=\"zero\" is "
                          "invalid"),
            std::string::npos)
      << Notes(r);
}

struct Refusal {
  std::string name;
  std::string yaml;
  std::string error;
};

TEST(Convert, RefusesBadInputNamingWhatIsWrong) {
  const std::string ok = Job("", "", "              command: [torchrun, t.py]");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = ok;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  const std::vector<Refusal> cases = {
      {"volcano job", Read("examples/jobs/elastic-job.yaml"),
       "kind is \"Job\"; expected a MindCluster AscendJob (kind: AscendJob, apiVersion: "
       "mindxdl.gitee.com/v1); a Volcano Job needs no conversion: check it with `regroupctl "
       "validate`"},
      {"no kind", with("kind: AscendJob\n", ""),
       "kind is missing; expected a MindCluster AscendJob (kind: AscendJob, apiVersion: "
       "mindxdl.gitee.com/v1)"},
      {"api version", with("mindxdl.gitee.com/v1", "kubeflow.org/v1"),
       "apiVersion is \"kubeflow.org/v1\"; an AscendJob is mindxdl.gitee.com/v1"},
      {"not utf-8", with("name: small", "name: sm\xc3\x28ll"),
       "the YAML document is not valid UTF-8 (byte 69)"},
      {"not yaml", "kind: AscendJob\nmetadata: [\n", ""},
      {"not a map", "- AscendJob\n", "the input is not a YAML map (an AscendJob)"},
      {"no name", with("name: small", "labelz: {}"), "metadata.name is missing"},
      {"bad name", with("name: small", "name: Small_Job"),
       "metadata.name \"Small_Job\" is not a DNS-1123 label (at most 63 lowercase letters, digits "
       "and '-'): Volcano names the job's pods and service after it"},
      {"mindspore", with("framework: pytorch", "framework: mindspore"),
       "label framework is \"mindspore\": regroupctl convert converts PyTorch jobs only "
       "(Regroup's trainer library is for PyTorch)"},
      {"labels not strings", with("    framework: pytorch", "    framework: [pytorch]"),
       "metadata.labels must map names to string values"},
      {"no replicaSpecs", with("  replicaSpecs:\n    Worker:", "  replicaSpecz:\n    Worker:"),
       "spec.replicaSpecs is missing: an AscendJob lists its pods there (Master and Worker)"},
      {"scheduler type", with("    Worker:", "    Scheduler:"),
       "spec.replicaSpecs.Scheduler is not a PyTorch replica type: a PyTorch AscendJob has Master "
       "and Worker replica specs only"},
      {"negative replicas", with("replicas: 2", "replicas: -1"),
       "spec.replicaSpecs.Worker.replicas must be an integer from 0 to 100000"},
      {"no pods", with("replicas: 2", "replicas: 0"),
       "the AscendJob has no pods: the replicas of spec.replicaSpecs add up to 0"},
      {"restart policy",
       with("      replicas: 2", "      replicas: 2\n      restartPolicy: Sometimes"),
       "spec.replicaSpecs.Worker.restartPolicy \"Sometimes\" is not one of Never, OnFailure, "
       "Always, ExitCode"},
      {"no template", with("      template:", "      templat:"),
       "spec.replicaSpecs.Worker.template is missing: it is the pod template of the Worker pods"},
      {"no containers", with("containers:", "initContainers:"),
       "spec.replicaSpecs.Worker.template.spec.containers must list the pod's containers"},
      {"env not a list", with("command: [torchrun, t.py]", "env: {A: b}"),
       "spec.replicaSpecs.Worker.template.spec.containers[0].env must be a list"},
      {"two jobs", ok + "---\n" + ok, "the input holds 2 AscendJobs; convert one at a time"},
      {"no documents", "# nothing\n---\n...\n", "the input holds no YAML document it can read"},
      // yaml-cpp's LoadAll never returns on this one.
      {"stray comma", "# c\n, x\nb: c\n", "the input holds no YAML document it can read"},
      {"two other documents", "kind: ConfigMap\n---\nkind: Secret\n",
       "none of the input's 2 YAML documents is an AscendJob (kind: AscendJob)"},
      {"backoff", with("spec:\n", "spec:\n  runPolicy: {backoffLimit: lots}\n"),
       "spec.runPolicy.backoffLimit must be a non-negative integer"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string error = ConvertError(c.yaml);
    if (c.error.empty())
      EXPECT_EQ(error.rfind("the input is not valid YAML: ", 0), 0u) << error;
    else
      EXPECT_EQ(error, c.error);
  }
}

TEST(Convert, DocumentMarkersSplitTheStream) {
  const std::string job = Job("", "", "              command: [torchrun, t.py]");
  ConvertResult r = MustConvert("---\n" + job + "...\n--- {kind: ConfigMap, data: {a: \"1\"}}\n");
  const auto docs = YAML::LoadAll(r.yaml);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1]["data"]["a"].Scalar(), "1");
  EXPECT_TRUE(HasNote(r, ConvertNote::Kind::kKept, "document 2",
                      "the input's other document (kind ConfigMap) follows the job unchanged"));
}

TEST(Convert, AliasesThatExpandWithoutBoundAreRefused) {
  std::string bomb = "              x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int i = 1; i < 8; ++i)
    bomb += "              x" + std::to_string(i) + ": &a" + std::to_string(i) + " [*a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + ", *a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + ", *a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + ", *a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + ", *a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + "]\n";
  EXPECT_EQ(ConvertError(Job("", "", bomb)),
            "the document expands to more than a million nodes (YAML aliases)");
}

TEST(Convert, DeployExampleValidates) {
  auto spec = JobSpecFromVolcanoYaml(Read("deploy/examples/pytorch-job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->id, "default/gpt-elastic");
  EXPECT_EQ(spec->pods, 4);
  EXPECT_EQ(spec->processes_per_pod, 8);
  EXPECT_EQ(spec->env.at("MINDIO_WAIT_MINDX_TIME"), "60");
  ASSERT_TRUE(spec->volcano);
  EXPECT_EQ(spec->volcano->manager_pods, 1);
  EXPECT_EQ(spec->volcano->min_available, 3);
  const ResolvedConfig resolved = spec->Resolve();
  EXPECT_TRUE(resolved.problems.empty()) << resolved.problems[0].message;
  EXPECT_TRUE(resolved.config.recovery_on());
  EXPECT_TRUE(resolved.config.allows(Strategy::kElasticTraining));
}

}  // namespace
}  // namespace regroup::cli
