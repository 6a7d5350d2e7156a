// SPDX-License-Identifier: Apache-2.0
// A job's credential at the coordinator, and the tickets of the epochs the coordinator grants
// (docs/security.md, "Job identity at the coordinator").
//
// The cluster key is held by the scheduler's side only. From it and a job's identity comes the
// job's token, which is all a job's namespace holds; the coordinator recomputes it for the job a
// manager claims to be, so a token is bound to one job and the cluster key never leaves the
// scheduler. The coordinator also signs the epochs it grants, so a manager that reattaches (to
// this coordinator or to the next, after a scheduler restart) can prove its epoch was granted,
// and no client can make one up.
//
// Both are HMAC-SHA256 (OpenSSL) under the cluster key, over domain-separated messages, written as
// 64 lowercase hex digits. The parts are joined by NUL bytes: a job id never holds one
// (CheckJobId) and an epoch is decimal, so each message reads back one way only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace regroup {

// The token of job `job_id` ("namespace/name") whose Kubernetes uid is `job_uid` (the Volcano
// Job's metadata.uid; a job deleted and created again under the same name gets a new token):
// HMAC-SHA256(cluster_key, "regroup-job-v1\0" + job_id + "\0" + job_uid), hex.
std::string JobToken(std::string_view cluster_key, std::string_view job_id,
                     std::string_view job_uid);

// The ticket of epoch `epoch` granted to job `job_id` (uid `job_uid`):
// HMAC-SHA256(cluster_key, "regroup-epoch-v1\0" + job_id + "\0" + job_uid + "\0" + decimal epoch).
std::string EpochTicket(std::string_view cluster_key, std::string_view job_id,
                        std::string_view job_uid, uint64_t epoch);

// Compares two secrets in time that depends only on their lengths.
bool SecretsEqual(std::string_view a, std::string_view b);

}  // namespace regroup
