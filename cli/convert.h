// SPDX-License-Identifier: Apache-2.0
// Converting a MindCluster AscendJob (mindxdl.gitee.com/v1) into the equivalent Volcano Job for
// Regroup, saying what changed and why.
//
// What the Volcano Job gets (every change is also a note of the result):
// - metadata: the name, the namespace, and every label and annotation unchanged (MindCluster's
//   keys mean the same under Regroup; see plugin/config.h);
// - the Master and Worker replica specs as training tasks ("worker"; Master and Worker are one
//   task when their templates are the same, since under Regroup rank 0's pod is not special);
//   their first container is the trainer: torchrun (or python -m torch.distributed.run) becomes
//   regroup-agent, which takes the same flags; it gets the environment that connects it to the
//   job's manager, the job's credential from a Secret, and port 9601 named taskd-port;
// - a one-replica CPU-only task "manager" running regroup-manager on port 9601;
// - schedulerName volcano, the Volcano `svc` plugin (the manager's address), and minAvailable at
//   the job's elastic minimum (the largest value `regroupctl validate` accepts);
// - runPolicy's queue, priority class, backoff limit and TTL in their Volcano places.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/version.h"
#include "plugin/job_spec.h"
#include "common/status.h"

namespace regroup::cli {

struct ConvertOptions {
  // The image of the manager task: it must hold regroup-manager.
  std::string manager_image = "regroup/regroup:" REGROUP_VERSION_STRING;
  // The coordinator in the Volcano scheduler (HOST:PORT) the manager sends the job's facts to,
  // so that the scheduler's engine makes the scheduling decisions. Empty: none (the manager's
  // embedded engine decides: standalone mode).
  std::string coordinator = "regroup-coordinator.volcano-system.svc:8899";
  // The Secret holding the job's credential under the key `token`. Empty: NAME-regroup-credential.
  std::string credential_secret;
  // The Secret whose ca.crt signed the coordinator's certificate (cert-manager's layout); the
  // manager checks the coordinator with it. Empty: NAME-regroup-tls.
  std::string tls_secret;
  // The coordinator serves plaintext: the manager checks no certificate (no TLS Secret).
  bool plaintext_coordinator = false;
};

// One thing the conversion did, or one the user must still do.
struct ConvertNote {
  enum class Kind : uint8_t {
    kChanged,  // a field moved or its value changed
    kAdded,    // something Regroup needs that the AscendJob did not have
    kDropped,  // a field with no Volcano equivalent, left out
    kKept,     // carried over unchanged, said because a user may wonder
    kCheck,    // something the converter cannot do: the user must check or do it
  };
  Kind kind;
  std::string field;    // where, in the output's terms ("spec.tasks[worker].template...")
  std::string message;  // what and why, one sentence
};
std::string_view NoteKindName(ConvertNote::Kind kind);

struct ConvertResult {
  std::string yaml;  // the Volcano Job, then the input's other documents unchanged
  JobSpec spec;      // the job as `regroupctl validate` reads the output
  ResolvedConfig resolved;  // the output's validation: problems are the user's to fix
  std::vector<ConvertNote> notes;
};

// Converts the one AscendJob of a YAML text (other documents, such as a ConfigMap, follow the
// Volcano Job unchanged). Refuses, with an error naming the field and what it must be: text that
// is not UTF-8 or not YAML, no AscendJob or more than one, a kind or apiVersion that is not
// MindCluster's, a framework other than PyTorch, a missing name or replicaSpecs, replica types
// other than Master and Worker, replicas out of range, a replica spec without containers. A
// converted job whose keys do not validate is not refused: its problems are in `resolved`.
StatusOr<ConvertResult> ConvertAscendJob(std::string_view yaml, const ConvertOptions& options);

// The notes and the validation's problems, one a line, as `regroupctl convert` prints them
// (`validate` of an AscendJob says "would convert", and ends with its "ok" line).
std::string FormatReport(const ConvertResult& result, std::string_view source,
                         std::string_view verb = "converted");

// What `validate` and `convert` add to the resolver's problems for a person adopting Regroup:
// warnings for a job that would not recover at all, and for a key its strategies leave unused.
// Only here, not in the resolver: the scheduler accepts such jobs as MindCluster does, without
// a warning every session.
void AddAdoptionAdvice(const JobSpec& spec, ResolvedConfig& resolved);

}  // namespace regroup::cli
