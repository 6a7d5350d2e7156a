// SPDX-License-Identifier: Apache-2.0
// A small epoll loop: the agent's one thread that owns all of its state. Descriptors are
// registered with a handler; each registration has its own id, so a descriptor number reused
// within one batch of events never reaches the handler of the descriptor it replaced.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>

#include "common/status.h"

namespace regroup::agent {

class EventLoop {
 public:
  using Handler = std::function<void(uint32_t events)>;  // EPOLLIN, EPOLLOUT, EPOLLHUP, ...

  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watches `fd` for `events` (level-triggered). The loop does not own the descriptor; remove it
  // before closing it.
  Status Add(int fd, uint32_t events, Handler handler);
  void Modify(int fd, uint32_t events);
  void Remove(int fd);

  // Waits up to `timeout_ms` (-1: no limit) and runs the handlers of the ready descriptors.
  // Returns the number of handlers run.
  int RunOnce(int timeout_ms);

 private:
  struct Entry {
    int fd;
    Handler handler;
  };
  int epoll_fd_ = -1;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;  // by registration id
  std::unordered_map<int, uint64_t> ids_;        // by descriptor
};

}  // namespace regroup::agent
