// SPDX-License-Identifier: Apache-2.0
#include "common/framing.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace regroup {
namespace {

uint32_t DecodeLength(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

Status ErrnoStatus(std::string_view what, int err) {
  return FailedPrecondition(std::string(what) + ": " + std::strerror(err));
}

// send() on sockets (no SIGPIPE); write() on anything else (pipes in tests).
ssize_t WriteSome(int fd, const char* data, size_t size, bool* is_socket) {
  if (*is_socket) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n >= 0 || errno != ENOTSOCK) return n;
    *is_socket = false;
  }
  return ::write(fd, data, size);
}

// Reads exactly `size` bytes. Returns the number read before a clean end of stream.
StatusOr<size_t> ReadFull(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, data + done, size - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      break;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, -1);
    } else {
      return ErrnoStatus("reading a frame", errno);
    }
  }
  return done;
}

}  // namespace

std::string EncodeFrame(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  std::string frame(kFrameHeaderBytes + size, '\0');
  frame[0] = static_cast<char>((size >> 24) & 0xff);
  frame[1] = static_cast<char>((size >> 16) & 0xff);
  frame[2] = static_cast<char>((size >> 8) & 0xff);
  frame[3] = static_cast<char>(size & 0xff);
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data()) +
                                          kFrameHeaderBytes);
  return frame;
}

Status WriteFrame(int fd, const google::protobuf::MessageLite& message, int timeout_ms) {
  if (message.ByteSizeLong() > 0xffffffffu)
    return {REGROUP_RESOURCE_EXHAUSTED, "a message of " + std::to_string(message.ByteSizeLong()) +
                                            " bytes does not fit a frame"};
  const std::string frame = EncodeFrame(message);
  bool is_socket = true;
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = WriteSome(fd, frame.data() + done, frame.size() - done, &is_socket);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) == 0)
        return FailedPrecondition("writing a frame: the peer did not read for " +
                                  std::to_string(timeout_ms) + " ms");
    } else {
      return ErrnoStatus("writing a frame", errno);
    }
  }
  return Status::Ok();
}

StatusOr<bool> ReadFrame(int fd, std::string* payload, size_t max_bytes) {
  char header[kFrameHeaderBytes];
  auto got = ReadFull(fd, header, sizeof header);
  if (!got.ok()) return got.status();
  if (*got == 0) return false;
  if (*got < sizeof header)
    return InvalidArgument("the stream ended inside a frame header (" + std::to_string(*got) +
                           " of 4 bytes)");
  const uint32_t length = DecodeLength(header);
  if (length > max_bytes)
    return Status{REGROUP_RESOURCE_EXHAUSTED, "a frame of " + std::to_string(length) +
                                                  " bytes is over the limit of " +
                                                  std::to_string(max_bytes)};
  payload->resize(length);
  got = ReadFull(fd, payload->data(), length);
  if (!got.ok()) return got.status();
  if (*got < length)
    return InvalidArgument("the stream ended inside a frame (" + std::to_string(*got) + " of " +
                           std::to_string(length) + " bytes)");
  return true;
}

FrameReader::Result FrameReader::Next(std::string* payload) {
  if (too_large_) return Result::kTooLarge;
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return Result::kNeedMore;
  const uint32_t length = DecodeLength(buffer_.data() + consumed_);
  if (length > max_bytes_) {
    too_large_ = true;
    refused_length_ = length;
    buffer_.clear();
    consumed_ = 0;
    return Result::kTooLarge;
  }
  if (available - kFrameHeaderBytes < length) {
    // Compact only when waiting for more, so a burst of small frames is not copied per frame.
    if (consumed_ > 0) {
      buffer_.erase(0, consumed_);
      consumed_ = 0;
    }
    return Result::kNeedMore;
  }
  payload->assign(buffer_, consumed_ + kFrameHeaderBytes, length);
  consumed_ += kFrameHeaderBytes + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return Result::kFrame;
}

Status ParseFrame(std::string_view payload, google::protobuf::MessageLite* message,
                  std::string_view what) {
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size())))
    return InvalidArgument("a frame of " + std::to_string(payload.size()) +
                           " bytes is not a valid " + std::string(what));
  return Status::Ok();
}

}  // namespace regroup
