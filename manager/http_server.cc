// SPDX-License-Identifier: Apache-2.0
#include "manager/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include "common/log_limit.h"

namespace regroup::manager {

namespace {

using Clock = std::chrono::steady_clock;

// Set on the accepting thread while it closes a connection over the limit (BoundedPool).
thread_local bool t_over_limit = false;

// At most `n` connections served at once, each on one of `n` threads; a connection that finds
// every thread busy is closed at once (its task runs on the accepting thread with t_over_limit
// set), never queued behind slow ones.
class BoundedPool final : public httplib::TaskQueue {
 public:
  explicit BoundedPool(size_t n) {
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      if (busy_ < threads_.size()) {
        ++busy_;
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    t_over_limit = true;
    fn();
    t_over_limit = false;
  }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
      std::lock_guard lock(mu_);
      --busy_;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t busy_ = 0;
  bool stopping_ = false;
};

std::string PeerOf(int sock, bool local) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int got = local ? ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                        : ::getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (got != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  else if (addr.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  return text;
}

int PortOf(int sock, bool local) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int got = local ? ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                        : ::getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (got != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

// One connection, plain or TLS, on a non-blocking socket: every wait ends at the connection's
// deadline, and the request may hold at most so many bytes and header lines. A read past a
// limit fails, and httplib then closes the connection.
class BoundedStream final : public httplib::Stream {
 public:
  BoundedStream(int sock, SSL* ssl, Clock::time_point deadline, const HttpLimits& limits)
      : sock_(sock), ssl_(ssl), deadline_(deadline), limits_(limits) {}

  // Completes the TLS handshake by the deadline; the reason when it does not.
  std::string Handshake() {
    for (;;) {
      const int r = SSL_accept(ssl_);
      if (r == 1) return "";
      const int error = SSL_get_error(ssl_, r);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        if (!Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT))
          return "the TLS handshake did not end within the connection's deadline";
        continue;
      }
      const unsigned long code = ERR_get_error();
      char reason[256] = "the peer closed the connection";
      if (code) ERR_error_string_n(code, reason, sizeof(reason));
      ERR_clear_error();
      return std::string("the TLS handshake failed: ") + reason;
    }
  }

  // Why the connection was cut, or "".
  const std::string& why() const { return why_; }

  bool is_readable() const override { return begin_ < end_ || (ssl_ && SSL_pending(ssl_) > 0); }
  bool is_writable() const override { return Clock::now() < deadline_; }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_ && !Fill()) return -1;
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      if (ssl_) {
        const int r = SSL_write(ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
        if (r > 0) return r;
        const int error = SSL_get_error(ssl_, r);
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) &&
            Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT))
          continue;
        ERR_clear_error();
        return -1;
      }
      const ssize_t r = ::send(sock_, ptr, size, MSG_NOSIGNAL);
      if (r >= 0) return r;
      if ((errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) && Wait(POLLOUT)) continue;
      return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = PeerOf(sock_, false);
    port = PortOf(sock_, false);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = PeerOf(sock_, true);
    port = PortOf(sock_, true);
  }
  int socket() const override { return sock_; }

 private:
  // Waits for `events` until the deadline.
  bool Wait(short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) {
        if (why_.empty()) why_ = "it did not finish within " + std::to_string(limits_.deadline.count()) + " ms";
        return false;
      }
      pollfd p{sock_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  bool Fill() {
    begin_ = end_ = 0;
    ssize_t n = 0;
    for (;;) {
      if (ssl_) {
        n = SSL_read(ssl_, buffer_, sizeof(buffer_));
        if (n > 0) break;
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) &&
            Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT))
          continue;
        ERR_clear_error();
        return false;
      }
      n = ::recv(sock_, buffer_, sizeof(buffer_), 0);
      if (n > 0) break;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) && Wait(POLLIN))
        continue;
      return false;
    }
    total_ += static_cast<size_t>(n);
    if (total_ > limits_.request_bytes) {
      why_ = "its request passed " + std::to_string(limits_.request_bytes) + " bytes";
      return false;
    }
    for (ssize_t i = 0; i < n && !head_done_; ++i) {
      const char c = buffer_[i];
      if (c == '\n') {
        if (line_bytes_ == 0) {
          head_done_ = true;
        } else if (++lines_ > limits_.header_lines + 1) {  // the request line and its headers
          why_ = "its request passed " + std::to_string(limits_.header_lines) + " header lines";
          return false;
        }
        line_bytes_ = 0;
      } else if (c != '\r') {
        ++line_bytes_;
      }
    }
    end_ = static_cast<size_t>(n);
    return true;
  }

  int sock_;
  SSL* ssl_;
  Clock::time_point deadline_;
  const HttpLimits& limits_;
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
  size_t total_ = 0, lines_ = 0, line_bytes_ = 0;
  bool head_done_ = false;
  std::string why_;
};

class BoundedServer final : public httplib::Server {
 public:
  BoundedServer(const HttpLimits& limits, SSL_CTX* ctx) : limits_(limits), ctx_(ctx) {
    new_task_queue = [n = limits.connections] { return new BoundedPool(n); };
    set_keep_alive_max_count(1);
    set_payload_max_length(limits.request_bytes);
  }
  ~BoundedServer() override {
    if (ctx_) SSL_CTX_free(ctx_);
  }

 private:
  bool process_and_close_socket(int sock) override {
    if (t_over_limit) {
      Refused(sock, std::to_string(limits_.connections) + " connections are being served, the most");
      ::close(sock);
      return false;
    }
    ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
    SSL* ssl = nullptr;
    if (ctx_) {
      ssl = SSL_new(ctx_);
      SSL_set_fd(ssl, sock);
    }
    BoundedStream stream(sock, ssl, Clock::now() + limits_.deadline, limits_);
    bool served = false;
    const std::string refused = ssl ? stream.Handshake() : "";
    if (refused.empty()) {
      bool closed = false;
      // The handlers see the connection's TLS session: ClientCertified.
      served = process_request(stream, /*close_connection=*/true, closed,
                               [ssl](httplib::Request& req) { req.ssl = ssl; });
      if (!stream.why().empty()) Refused(sock, stream.why());
      if (ssl) SSL_shutdown(ssl);
    } else {
      Refused(sock, refused);
    }
    if (ssl) SSL_free(ssl);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return served;
  }

  void Refused(int sock, const std::string& why) {
    std::lock_guard lock(log_mu_);
    if (auto held = log_.Allow(LogLimit::Clock::now()))
      spdlog::warn("closed an HTTP connection from {}:{}: {}{}", PeerOf(sock, false),
                   PortOf(sock, false), why,
                   *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
  }

  HttpLimits limits_;
  SSL_CTX* ctx_;
  std::mutex log_mu_;
  LogLimit log_{std::chrono::seconds(1)};
};

// The reason OpenSSL gives for the last failure, or "".
std::string OpenSslReason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (!code) return "";
  char reason[256];
  ERR_error_string_n(code, reason, sizeof(reason));
  return reason;
}

}  // namespace

bool ClientCertified(const httplib::Request& request) {
  if (!request.ssl) return false;
  X509* cert = SSL_get1_peer_certificate(request.ssl);
  const bool verified = cert && SSL_get_verify_result(request.ssl) == X509_V_OK;
  X509_free(cert);
  return verified;
}

StatusOr<std::unique_ptr<httplib::Server>> MakeHttpServer(const std::string& cert_file,
                                                          const std::string& key_file,
                                                          const HttpLimits& limits,
                                                          const std::string& client_ca_file) {
  if (cert_file.empty() || key_file.empty()) {
    if (!client_ca_file.empty())
      return InvalidArgument("the TLS client CA " + client_ca_file +
                             " needs the server's own certificate and key: clients are checked "
                             "only over HTTPS");
    return std::unique_ptr<httplib::Server>(new BoundedServer(limits, nullptr));
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return FailedPrecondition("cannot make a TLS context: " + OpenSslReason());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  std::string error;
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1)
    error = "cannot use the certificate " + cert_file + ": " + OpenSslReason();
  else if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    error = "cannot use the key " + key_file + ": " + OpenSslReason();
  else if (SSL_CTX_check_private_key(ctx) != 1)
    error = "the key " + key_file + " does not match the certificate " + cert_file;
  else if (!client_ca_file.empty()) {
    // Asked for, not required: a client without one (a kubelet's probe) still gets /healthz and
    // /readyz, and the handlers refuse it the rest (ClientCertified). One presented that the CA
    // did not sign fails the handshake.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca_file.c_str());
    if (!names || SSL_CTX_load_verify_locations(ctx, client_ca_file.c_str(), nullptr) != 1) {
      error = "cannot use the TLS client CA " + client_ca_file + ": " + OpenSslReason();
      if (names) sk_X509_NAME_pop_free(names, X509_NAME_free);
    } else {
      SSL_CTX_set_client_CA_list(ctx, names);
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    }
  }
  if (!error.empty()) {
    SSL_CTX_free(ctx);
    return InvalidArgument(error);
  }
  return std::unique_ptr<httplib::Server>(new BoundedServer(limits, ctx));
}

}  // namespace regroup::manager
