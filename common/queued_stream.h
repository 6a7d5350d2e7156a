// A server side of a bidirectional gRPC stream (callback API) whose writes are queued, since
// gRPC allows one write in flight per stream. Used by the manager's Manager.Session and the
// coordinator's Coordinator.Attach.
//
// `Owner` receives the stream's messages and its end: Owner::OnMessage(Stream*, const In&) and
// Owner::OnStreamDone(Stream*), after which the stream deletes itself.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace regroup {

template <typename In, typename Out, typename Owner>
class QueuedStream final : public grpc::ServerBidiReactor<In, Out> {
 public:
  // `gone` is the UNAVAILABLE message used when a write fails (the peer is gone).
  QueuedStream(Owner* owner, uint64_t id, std::string gone)
      : owner_(owner), id_(id), gone_(std::move(gone)) {
    this->StartRead(&in_);
  }

  uint64_t id() const { return id_; }
  int64_t tag = -1;  // the owner's own use (the manager keeps the agent's node rank here)

  // Queues a message; with `close`, the stream finishes with `status` once it is written.
  void Send(const Out& message, bool close = false, const grpc::Status& status = grpc::Status::OK) {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    queue_.push_back(message);
    if (close) {
      finishing_ = true;
      close_status_ = status;
    }
    if (!writing_) {
      writing_ = true;
      this->StartWrite(&queue_.front());
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
    queue_.pop_front();
    if (!ok) {
      writing_ = false;
      finishing_ = true;
      this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, gone_));
      return;
    }
    if (!queue_.empty()) {
      this->StartWrite(&queue_.front());
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
  In in_;
  std::mutex mu_;
  std::deque<Out> queue_;
  bool writing_ = false;
  bool finishing_ = false;
  grpc::Status close_status_;
};

}  // namespace regroup
