// SPDX-License-Identifier: Apache-2.0
#include "agent/event_loop.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace regroup::agent {

EventLoop::EventLoop() : epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {}

EventLoop::~EventLoop() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status EventLoop::Add(int fd, uint32_t events, Handler handler) {
  if (epoll_fd_ < 0) return FailedPrecondition("epoll is not available");
  const uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
    return FailedPrecondition("cannot watch descriptor " + std::to_string(fd) + ": " +
                              std::strerror(errno));
  entries_.emplace(id, Entry{fd, std::move(handler)});
  ids_[fd] = id;
  return Status::Ok();
}

void EventLoop::Modify(int fd, uint32_t events) {
  auto it = ids_.find(fd);
  if (it == ids_.end()) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = it->second;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::Remove(int fd) {
  auto it = ids_.find(fd);
  if (it == ids_.end()) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  entries_.erase(it->second);
  ids_.erase(it);
}

int EventLoop::RunOnce(int timeout_ms) {
  epoll_event events[64];
  int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
  if (n <= 0) return 0;
  int ran = 0;
  for (int i = 0; i < n; ++i) {
    auto it = entries_.find(events[i].data.u64);
    if (it == entries_.end()) continue;  // removed by an earlier handler of this batch
    Handler handler = it->second.handler;  // a copy: the handler may remove itself
    handler(events[i].events);
    ++ran;
  }
  return ran;
}

}  // namespace regroup::agent
