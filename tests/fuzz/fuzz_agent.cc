// SPDX-License-Identifier: Apache-2.0
// fuzz_agent: what a trainer can send its agent (agent/): bytes through the frame reader
// in chunks, frames parsed as TrainerMessage, votes through the vote tally.
//
// The first input byte sets the chunk size of the stream (1 to 64 bytes); the rest is the byte
// stream a trainer connection delivers. The harness checks the frame reader's invariants (no
// frame over its bound, a refused frame stays refused) and that every Votes the tally returns
// names only assigned ranks of its generation, in ascending order, once.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "fuzz_common.h"
#include "agent/vote_tally.h"
#include "common/framing.h"

namespace {

namespace v1 = ::regroup::v1;
constexpr size_t kBound = 4096;  // small, so the fuzzer reaches the refusal path

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + (data[0] & 63);
  regroup::FrameReader reader(kBound);
  regroup::agent::VoteTally tally;
  tally.Start(1, {0, 1, 2});
  bool refused = false;
  for (size_t at = 1; at < size; at += chunk) {
    reader.Append(reinterpret_cast<const char*>(data + at), std::min(chunk, size - at));
    std::string payload;
    for (;;) {
      const auto result = reader.Next(&payload);
      if (result == regroup::FrameReader::Result::kNeedMore) break;
      if (result == regroup::FrameReader::Result::kTooLarge) {
        refused = true;
        break;
      }
      if (refused) fuzz::Die("FrameReader::Next", "a frame after a refused one");
      if (payload.size() > kBound) fuzz::Die("FrameReader::Next", "a frame over the bound");
      v1::TrainerMessage message;
      if (!regroup::ParseFrame(payload, &message, "a trainer message").ok()) continue;
      if (message.has_vote()) {
        (void)tally.Add(static_cast<uint32_t>(message.vote().step() & 3), message.vote());
        for (const auto& votes : tally.TakeComplete([](uint32_t l) { return l != 3; })) {
          if (votes.generation() != 1) fuzz::Die("VoteTally", "votes of another generation");
          std::set<uint32_t> seen;
          uint32_t last = 0;
          for (int i = 0; i < votes.local_ranks_size(); ++i) {
            const uint32_t l = votes.local_ranks(i);
            if (!tally.assigned(l)) fuzz::Die("VoteTally", "a vote of an unassigned rank");
            if (!seen.insert(l).second) fuzz::Die("VoteTally", "a rank counted twice");
            if (i > 0 && l < last) fuzz::Die("VoteTally", "local ranks out of order");
            last = l;
          }
          if (votes.checksums_size() != 0 && votes.checksums_size() != votes.local_ranks_size())
            fuzz::Die("VoteTally", "checksums that do not match the ranks");
        }
      } else if (message.has_ack() && (message.ack().directive_id() & 1)) {
        tally.Settle(1, static_cast<int64_t>(message.ack().directive_id() >> 1));
      }
    }
    if (refused) break;
  }
  return 0;
}
