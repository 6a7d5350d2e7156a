// SPDX-License-Identifier: Apache-2.0
// A server side of a bidirectional gRPC stream (callback API) whose writes are queued, since
// gRPC allows one write in flight per stream. Used by the manager's Manager.Session and the
// coordinator's Coordinator.Attach.
//
// `Owner` receives the stream's messages and its end: Owner::OnMessage(Stream*, const In&) and
// Owner::OnStreamDone(Stream*), after which the stream deletes itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace regroup {

// What one stream may hold queued and unwritten: far above what a live peer ever lags behind
// (a manager's messages to an agent are a few hundred bytes), far below what hurts the server.
inline constexpr size_t kMaxQueuedBytes = size_t{8} << 20;

template <typename In, typename Out, typename Owner>
class QueuedStream final : public grpc::ServerBidiReactor<In, Out> {
 public:
  // `gone` is the UNAVAILABLE message used when a write fails (the peer is gone). `context` is
  // the call's, used to cut off a peer that stops reading.
  QueuedStream(Owner* owner, uint64_t id, std::string gone, grpc::CallbackServerContext* context,
               size_t max_queued_bytes = kMaxQueuedBytes)
      : owner_(owner), id_(id), gone_(std::move(gone)), context_(context),
        max_queued_bytes_(max_queued_bytes) {
    this->StartRead(&in_);
  }

  uint64_t id() const { return id_; }
  int64_t tag = -1;  // the owner's own use (the manager keeps the agent's node rank here)

  // Why the stream was cut off ("" when it was not): its peer read too slowly, and what was
  // queued for it passed the bound. For the owner's log, in OnStreamDone.
  std::string cut_off() const {
    std::lock_guard lock(mu_);
    return cut_off_;
  }

  // Queues a message; with `close`, the stream finishes with `status` once it is written. A peer
  // that lets more than the bound pile up unwritten is cut off (the call is cancelled, and what
  // was queued is dropped): one slow or stopped reader never grows the server without bound.
  void Send(Out message, bool close = false, const grpc::Status& status = grpc::Status::OK) {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    const size_t bytes = message.ByteSizeLong();
    if (queued_bytes_ + bytes > max_queued_bytes_ && !queue_.empty()) {
      cut_off_ = "its peer " + context_->peer() + " reads too slowly: " +
                 std::to_string(queued_bytes_ + bytes) + " bytes would be queued, above the " +
                 std::to_string(max_queued_bytes_) + " a stream may hold";
      finishing_ = true;
      // The write in flight stays until gRPC is done with it; the rest is dropped.
      while (queue_.size() > (writing_ ? 1 : 0)) queue_.pop_back();
      queued_bytes_ = writing_ ? queue_.front().bytes : 0;
      close_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, cut_off_);
      context_->TryCancel();
      if (!writing_) this->Finish(close_status_);
      return;
    }
    queue_.push_back({std::move(message), bytes});
    queued_bytes_ += bytes;
    if (close) {
      finishing_ = true;
      close_status_ = status;
    }
    if (!writing_) {
      writing_ = true;
      this->StartWrite(&queue_.front().message);
    }
  }

  // Finishes the stream with `status` after what is queued is written.
  void Close(const grpc::Status& status) {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    finishing_ = true;
    close_status_ = status;
    if (!writing_) this->Finish(status);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the peer ended its side, or the stream broke
      Close(grpc::Status::OK);
      return;
    }
    owner_->OnMessage(this, in_);
    std::lock_guard lock(mu_);
    if (!finishing_) this->StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    queued_bytes_ -= queue_.front().bytes;
    queue_.pop_front();
    if (!ok) {
      writing_ = false;
      finishing_ = true;
      this->Finish(cut_off_.empty() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, gone_)
                                    : close_status_);
      return;
    }
    if (!queue_.empty()) {
      this->StartWrite(&queue_.front().message);
      return;
    }
    writing_ = false;
    if (finishing_) this->Finish(close_status_);
  }

  void OnDone() override {
    owner_->OnStreamDone(this);
    delete this;
  }

 private:
  Owner* owner_;
  const uint64_t id_;
  const std::string gone_;
  grpc::CallbackServerContext* const context_;
  const size_t max_queued_bytes_;
  In in_;
  mutable std::mutex mu_;
  struct Queued {
    Out message;
    size_t bytes;  // its serialized size, counted once
  };
  std::deque<Queued> queue_;
  size_t queued_bytes_ = 0;
  std::string cut_off_;
  bool writing_ = false;
  bool finishing_ = false;
  grpc::Status close_status_;
};

}  // namespace regroup
