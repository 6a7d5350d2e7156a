// SPDX-License-Identifier: Apache-2.0
// Framed protobuf messages over a stream socket: the trainer <-> agent wire format.
//
// A frame is a 4-byte big-endian payload length, then the payload (one serialized message).
// The Python trainer library (package `regroup`) implements the same format; keep them equal.
// Frames larger than the reader's bound are refused, so a broken or hostile peer cannot make
// the reader allocate without limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

#include "common/status.h"

namespace regroup {

// The largest payload either side accepts by default (a generation plan is far smaller).
inline constexpr size_t kMaxFrameBytes = 16u << 20;
inline constexpr size_t kFrameHeaderBytes = 4;

// Returns the header and payload of one frame holding `message`.
std::string EncodeFrame(const google::protobuf::MessageLite& message);

// Writes one frame to a blocking or non-blocking descriptor, retrying on EINTR and waiting for
// writability (up to `timeout_ms`, -1: no limit) on EAGAIN. Never raises SIGPIPE.
Status WriteFrame(int fd, const google::protobuf::MessageLite& message, int timeout_ms = -1);

// Reads one frame's payload from a blocking descriptor into `payload`. Returns true with a
// frame, false at a clean end of stream (no byte of a next frame read), or an error: a frame
// longer than `max_bytes`, a stream that ends inside a frame, or a read error.
StatusOr<bool> ReadFrame(int fd, std::string* payload, size_t max_bytes = kMaxFrameBytes);

// Incremental frame splitting for non-blocking readers: append what arrived, then take whole
// frames out. Once a frame over the bound is seen the reader stays in the error state (the
// connection must be closed: its framing is lost).
class FrameReader {
 public:
  enum class Result { kFrame, kNeedMore, kTooLarge };

  explicit FrameReader(size_t max_bytes = kMaxFrameBytes) : max_bytes_(max_bytes) {}

  void Append(const char* data, size_t size) { buffer_.append(data, size); }
  // Changes the bound for the frames not yet taken out (a peer earns a larger one by saying who
  // it is).
  void set_max_bytes(size_t max_bytes) { max_bytes_ = max_bytes; }
  // Moves the next whole frame's payload into `payload`.
  Result Next(std::string* payload);
  // The length the last refused header announced (for error messages).
  uint64_t refused_length() const { return refused_length_; }
  // Bytes held that do not yet form a whole frame.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  size_t max_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
  bool too_large_ = false;
  uint64_t refused_length_ = 0;
};

// Parses a payload into `message`; an error names `what` when it is not a valid message.
Status ParseFrame(std::string_view payload, google::protobuf::MessageLite* message,
                  std::string_view what);

}  // namespace regroup
