// SPDX-License-Identifier: Apache-2.0
#include "agent/manager_session.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/credential.h"
#include "common/grpc_settings.h"

namespace regroup::agent {

using regroup::v1::AgentMessage;
using regroup::v1::ManagerMessage;

Inbox::Inbox() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Inbox::~Inbox() {
  if (fd_ >= 0) close(fd_);
}

void Inbox::Push(SessionEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  uint64_t one = 1;
  ssize_t ignored = write(fd_, &one, sizeof one);
  (void)ignored;
}

std::deque<SessionEvent> Inbox::Drain() {
  uint64_t count;
  ssize_t ignored = read(fd_, &count, sizeof count);
  (void)ignored;
  std::lock_guard lock(mutex_);
  std::deque<SessionEvent> out;
  out.swap(events_);
  return out;
}

ManagerSession::ManagerSession(uint64_t id, std::shared_ptr<grpc::Channel> channel,
                               std::string credential, Inbox* inbox)
    : id_(id), channel_(std::move(channel)), credential_(std::move(credential)), inbox_(inbox) {
  AttachCredential(context_, credential_);
  context_.set_wait_for_ready(true);
  reader_ = std::thread([this] { Read(); });
}

ManagerSession::~ManagerSession() {
  Cancel();
  if (reader_.joinable()) reader_.join();
}

void ManagerSession::Send(const AgentMessage& message) {
  bool overflow = false;
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() >= kMaxQueued) {
      overflow = true;
    } else {
      queue_.push_back(message);
    }
  }
  if (overflow) {
    spdlog::error("manager session {}: {} messages wait to be written; the manager is not reading: "
                  "ending the session",
                  id_, kMaxQueued);
    Cancel();
    return;
  }
  changed_.notify_all();
}

bool ManagerSession::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [this] {
    return (queue_.empty() && !writing_) || write_failed_ || closing_;
  }) && queue_.empty() && !writing_;
}

void ManagerSession::Cancel() { context_.TryCancel(); }

ManagerSession::Closed ManagerSession::Close(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  half_close_ = true;
  changed_.notify_all();
  const bool ended = changed_.wait_for(lock, timeout, [this] { return ended_; });
  Closed closed;
  closed.unwritten = queue_;
  if (!ended) {
    closed.reason = "the manager did not end the session within " +
                    std::to_string(timeout.count()) + " ms of the agent's last message";
  } else if (!end_status_.ok()) {
    closed.reason = "the session ended with code " + std::to_string(end_status_.error_code()) +
                    ": " + end_status_.error_message();
  } else if (!queue_.empty() || write_failed_) {
    closed.reason = "the session ended before every message was written";
  } else {
    closed.confirmed = true;
  }
  return closed;
}

void ManagerSession::Read() {
  auto stub = regroup::v1::Manager::NewStub(channel_);
  stream_ = stub->Session(&context_);  // returns once connected (or cancelled)
  inbox_->Push({SessionEvent::Kind::kOpened, id_, {}, {}});
  writer_ = std::thread([this] { Write(); });
  ManagerMessage message;
  while (stream_->Read(&message)) {
    inbox_->Push({SessionEvent::Kind::kMessage, id_, std::move(message), {}});
    message = ManagerMessage();
  }
  bool writing;
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
    writing = writing_;
  }
  changed_.notify_all();
  // A Write() still in flight on a call that is over returns once the call is cancelled.
  if (writing) context_.TryCancel();
  writer_.join();
  grpc::Status status = stream_->Finish();
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
    end_status_ = status;
  }
  changed_.notify_all();
  std::string detail = status.ok() ? "the manager ended the session"
                                   : "code " + std::to_string(status.error_code()) + ": " +
                                         status.error_message();
  inbox_->Push({SessionEvent::Kind::kClosed, id_, {}, std::move(detail), status.ok()});
}

void ManagerSession::Write() {
  for (;;) {
    AgentMessage message;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return closing_ || !queue_.empty() || half_close_; });
      if (closing_) return;
      if (queue_.empty()) {  // half_close_: everything is written; tell the manager
        lock.unlock();
        stream_->WritesDone();
        lock.lock();
        changed_.wait(lock, [this] { return closing_; });
        return;
      }
      message = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const bool ok = stream_->Write(message);
    {
      std::lock_guard lock(mutex_);
      writing_ = false;
      if (!ok) write_failed_ = true;
    }
    changed_.notify_all();
    if (!ok) return;  // the reader sees the end and reports it
  }
}

struct ConnectProbe::Call {
  grpc::ClientContext context;
  regroup::v1::GetStatusRequest request;
  regroup::v1::GetStatusResponse response;
  std::unique_ptr<regroup::v1::Manager::Stub> stub;
};

ConnectProbe::ConnectProbe(std::shared_ptr<grpc::Channel> channel, std::string target,
                           std::string credential, std::string job_id, bool tls)
    : channel_(std::move(channel)),
      target_(std::move(target)),
      credential_(std::move(credential)),
      job_id_(std::move(job_id)),
      tls_(tls) {}

ConnectProbe::~ConnectProbe() {
  std::unique_lock lock(state_->mutex);
  if (state_->in_flight) state_->in_flight->context.TryCancel();
  state_->ended.wait_for(lock, std::chrono::seconds(5), [this] { return !state_->in_flight; });
}

void ConnectProbe::Start(std::chrono::milliseconds deadline) {
  std::lock_guard lock(state_->mutex);
  if (state_->in_flight) return;
  state_->ended_call.reset();
  auto call = std::make_shared<Call>();
  AttachCredential(call->context, credential_);
  call->context.set_wait_for_ready(false);  // fails on the connection attempt's failure
  call->context.set_deadline(std::chrono::system_clock::now() + deadline);
  call->request.set_job_id(job_id_);
  call->stub = regroup::v1::Manager::NewStub(channel_);
  state_->in_flight = call;
  call->stub->async()->GetStatus(
      &call->context, &call->request, &call->response,
      [state = state_, target = target_, tls = tls_](grpc::Status status) {
        std::lock_guard lock(state->mutex);
        // A probe that only ran out of time learned nothing: the last reason stands.
        if (status.ok() || status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
            status.error_code() == grpc::StatusCode::PERMISSION_DENIED)
          state->last.clear();  // the manager answered
        else if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
                 status.error_code() != grpc::StatusCode::CANCELLED)
          state->last = DescribeCallFailure(status, target, tls);
        state->ended_call = std::move(state->in_flight);  // its context outlives this callback
        state->ended.notify_all();
      });
}

std::string ConnectProbe::Last() const {
  std::lock_guard lock(state_->mutex);
  return state_->last;
}

}  // namespace regroup::agent
