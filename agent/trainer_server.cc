// SPDX-License-Identifier: Apache-2.0
#include "agent/trainer_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace regroup::agent {
namespace {

using regroup::v1::AgentReply;
using regroup::v1::TrainerMessage;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Whether process `pid` exists (a zombie counts until its parent reaps it).
bool ProcessLives(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// mkdir -p with mode 0700 for what it creates; the last component must end up a directory
// owned by this user with mode 0700.
Status MakePrivateDir(const std::string& dir, bool* created) {
  *created = false;
  for (size_t slash = dir.find('/', 1); slash != std::string::npos;
       slash = dir.find('/', slash + 1)) {
    std::string parent = dir.substr(0, slash);
    if (mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST)
      return FailedPrecondition(Errno("cannot create the socket directory's parent " + parent));
  }
  if (mkdir(dir.c_str(), 0700) == 0) {
    *created = true;
  } else if (errno != EEXIST) {
    return FailedPrecondition(Errno("cannot create the socket directory " + dir));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return FailedPrecondition(Errno("cannot inspect " + dir));
  if (!S_ISDIR(st.st_mode))
    return FailedPrecondition("the socket directory " + dir +
                              " exists and is not a directory: give another --socket-dir");
  if (st.st_uid != geteuid())
    return FailedPrecondition("the socket directory " + dir +
                              " belongs to another user: give another --socket-dir");
  if ((st.st_mode & 0777) != 0700 && chmod(dir.c_str(), 0700) != 0)
    return FailedPrecondition(Errno("cannot make " + dir + " private (mode 0700)"));
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<TrainerServer>> TrainerServer::Listen(EventLoop* loop,
                                                               const std::string& dir,
                                                               uint32_t nproc, Listener* listener,
                                                               size_t max_frame_bytes) {
  std::unique_ptr<TrainerServer> server(new TrainerServer(loop, nproc, listener, max_frame_bytes));
  server->dir_ = dir;
  while (server->dir_.size() > 1 && server->dir_.back() == '/') server->dir_.pop_back();
  REGROUP_RETURN_IF_ERROR(MakePrivateDir(server->dir_, &server->created_dir_));
  server->socket_path_ = server->dir_ + "/agent.sock";

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (server->socket_path_.size() >= sizeof addr.sun_path)
    return InvalidArgument("the trainer socket path " + server->socket_path_ + " is longer than " +
                           std::to_string(sizeof addr.sun_path - 1) +
                           " bytes: give a shorter --socket-dir");
  std::memcpy(addr.sun_path, server->socket_path_.c_str(), server->socket_path_.size() + 1);

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return FailedPrecondition(Errno("cannot create the trainer socket"));
  server->listen_fd_ = fd;
  // A socket left by an earlier agent is removed; one that still answers belongs to a live agent
  // (two agents given the same --socket-dir) and is not taken over.
  if (int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(probe);
    if (live)
      return FailedPrecondition("another process listens on the trainer socket " +
                                server->socket_path_ + ": give each agent its own --socket-dir");
  }
  unlink(server->socket_path_.c_str());
  const mode_t old_mask = umask(0177);    // the socket file is born 0600
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old_mask);
  if (bound != 0)
    return FailedPrecondition(Errno("cannot bind the trainer socket " + server->socket_path_));
  server->owns_socket_ = true;
  if (chmod(server->socket_path_.c_str(), 0600) != 0)
    return FailedPrecondition(Errno("cannot set mode 0600 on " + server->socket_path_));
  if (listen(fd, 128) != 0)
    return FailedPrecondition(Errno("cannot listen on " + server->socket_path_));
  TrainerServer* self = server.get();
  REGROUP_RETURN_IF_ERROR(loop->Add(fd, EPOLLIN, [self](uint32_t) { self->Accept(); }));
  return server;
}

TrainerServer::~TrainerServer() {
  std::vector<int> fds;
  for (auto& [fd, c] : connections_) fds.push_back(fd);
  for (int fd : fds) Close(fd, /*notify=*/false);
  if (listen_fd_ >= 0) {
    loop_->Remove(listen_fd_);
    close(listen_fd_);
  }
  if (owns_socket_) unlink(socket_path_.c_str());
  if (created_dir_) rmdir(dir_.c_str());  // fails harmlessly when something else is in it
}

void TrainerServer::Accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        spdlog::error("trainer socket: accept failed: {}", std::strerror(errno));
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (anonymous() >= kMaxAnonymous) {
      close(fd);
      if (auto held = refusal_log_.Allow(now))
        spdlog::error("trainer socket: {} connection(s) refused: {} connections have not said "
                      "hello yet (at most {})",
                      *held + 1, anonymous(), kMaxAnonymous);
      continue;
    }
    auto c = std::make_unique<Connection>(kMaxHelloBytes);
    c->fd = fd;
    c->accepted = now;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) c->peer_pid = cred.pid;
    Status added = loop_->Add(fd, EPOLLIN | EPOLLRDHUP,
                              [this, fd](uint32_t events) { OnEvents(fd, events); });
    if (!added.ok()) {
      spdlog::error("trainer socket: {}", added.message());
      close(fd);
      continue;
    }
    spdlog::debug("trainer socket: connection from pid {}", c->peer_pid);
    connections_.emplace(fd, std::move(c));
  }
}

void TrainerServer::OnEvents(int fd, uint32_t events) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  if (events & EPOLLOUT) {
    if (!Flush(c)) return;
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR)) ReadFrom(c);
}

void TrainerServer::ReadFrom(Connection& c) {
  const int fd = c.fd;
  char buffer[65536];
  bool eof = false;
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      c.reader.Append(buffer, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buffer) break;
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    eof = true;  // ECONNRESET and friends: the peer is gone
    break;
  }
  std::string payload;
  for (;;) {
    auto found = connections_.find(fd);
    if (found == connections_.end() || found->second.get() != &c) return;  // closed meanwhile
    auto result = c.reader.Next(&payload);
    if (result == FrameReader::Result::kNeedMore) break;
    if (result == FrameReader::Result::kTooLarge) {
      // Before its hello a connection may send kMaxHelloBytes (issue 40: the message named the
      // 16 MiB of later frames).
      const size_t limit = c.local_rank < 0 ? kMaxHelloBytes : max_frame_bytes_;
      CloseWithError(c, "a frame of " + std::to_string(c.reader.refused_length()) +
                            " bytes is over the limit of " + std::to_string(limit) +
                            (c.local_rank < 0 ? " bytes before a hello" : " bytes"));
      return;
    }
    TrainerMessage message;
    Status parsed = ParseFrame(payload, &message, "TrainerMessage");
    if (!parsed.ok()) {
      CloseWithError(c, parsed.message());
      return;
    }
    if (message.has_hello()) {
      const uint32_t rank = message.hello().local_rank();
      if (rank >= nproc_) {
        CloseWithError(c, "hello for local rank " + std::to_string(rank) +
                              ", but this agent runs " + std::to_string(nproc_) + " processes");
        return;
      }
      if (c.local_rank != static_cast<int64_t>(rank)) {
        if (c.local_rank >= 0) {
          CloseWithError(c, "a second hello naming another local rank " + std::to_string(rank));
          return;
        }
        auto old = ranks_.find(rank);
        if (old != ranks_.end()) {
          const pid_t holder = connections_.at(old->second)->peer_pid;
          if (holder > 0 && holder != c.peer_pid && ProcessLives(holder)) {
            CloseWithError(c, "hello for local rank " + std::to_string(rank) +
                                  ", which process " + std::to_string(holder) +
                                  " holds and is alive");
            return;
          }
          spdlog::info("trainer socket: local rank {} connected again (pid {}); closing its older "
                       "connection (pid {}, gone)",
                       rank, c.peer_pid, holder);
          Close(old->second, /*notify=*/false);
        }
        c.local_rank = rank;
        c.reader.set_max_bytes(max_frame_bytes_);
        ranks_[rank] = fd;
      }
      listener_->OnHello(rank, message.hello());
      continue;
    }
    if (c.local_rank < 0) {
      CloseWithError(c, "a message before the hello");
      return;
    }
    listener_->OnMessage(static_cast<uint32_t>(c.local_rank), message);
  }
  if (eof) {
    auto found = connections_.find(fd);
    if (found == connections_.end() || found->second.get() != &c) return;
    if (c.reader.buffered() > 0)
      spdlog::error("trainer socket: {} closed inside a frame ({} bytes of it unread)",
                    Describe(c), c.reader.buffered());
    Close(fd, /*notify=*/true);
  }
}

bool TrainerServer::Send(uint32_t local_rank, const AgentReply& reply) {
  auto it = ranks_.find(local_rank);
  if (it == ranks_.end()) return false;
  Connection& c = *connections_.at(it->second);
  const bool was_idle = c.pending.empty();
  c.pending += EncodeFrame(reply);
  if (c.pending.size() > kMaxPendingBytes) {
    CloseWithError(c, "it left " + std::to_string(c.pending.size()) + " bytes of replies unread");
    return false;
  }
  if (!was_idle) return true;  // EPOLLOUT is already armed
  return Flush(c);
}

bool TrainerServer::Flush(Connection& c) {
  size_t done = 0;
  while (done < c.pending.size()) {
    ssize_t n = send(c.fd, c.pending.data() + done, c.pending.size() - done, MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    spdlog::warn("trainer socket: writing to {} failed: {}", Describe(c), std::strerror(errno));
    Close(c.fd, /*notify=*/true);
    return false;
  }
  c.pending.erase(0, done);
  loop_->Modify(c.fd, EPOLLIN | EPOLLRDHUP | (c.pending.empty() ? 0u : uint32_t{EPOLLOUT}));
  return true;
}

void TrainerServer::Close(int fd, bool notify) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  const int64_t rank = it->second->local_rank;
  loop_->Remove(fd);
  close(fd);
  connections_.erase(it);
  if (rank >= 0) {
    auto r = ranks_.find(static_cast<uint32_t>(rank));
    if (r != ranks_.end() && r->second == fd) {
      ranks_.erase(r);
      if (notify) listener_->OnDisconnect(static_cast<uint32_t>(rank));
    }
  }
}

void TrainerServer::CloseWithError(Connection& c, const std::string& why) {
  spdlog::error("trainer socket: closing {}: {}", Describe(c), why);
  Close(c.fd, /*notify=*/true);
}

std::string TrainerServer::Describe(const Connection& c) const {
  std::string out = c.local_rank >= 0 ? "local rank " + std::to_string(c.local_rank)
                                      : std::string("an unidentified connection");
  if (c.peer_pid > 0) out += " (pid " + std::to_string(c.peer_pid) + ")";
  return out;
}

void TrainerServer::CloseSilent(std::chrono::steady_clock::time_point now) {
  std::vector<int> silent;
  for (const auto& [fd, c] : connections_)
    if (c->local_rank < 0 && now - c->accepted >= kHelloTimeout) silent.push_back(fd);
  for (int fd : silent)
    CloseWithError(*connections_.at(fd), "no hello within " +
                                             std::to_string(kHelloTimeout.count()) + " ms");
}

pid_t TrainerServer::peer_pid(uint32_t local_rank) const {
  auto it = ranks_.find(local_rank);
  if (it == ranks_.end()) return 0;
  return connections_.at(it->second)->peer_pid;
}

}  // namespace regroup::agent
