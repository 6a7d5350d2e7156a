// SPDX-License-Identifier: Apache-2.0
#include "common/safe_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace regroup {

namespace {

std::string Directory(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view contents,
                           std::string_view what, mode_t mode) {
  const std::string named = what.empty() ? path : "the " + std::string(what) + " " + path;
  std::string pattern = path + ".tmp.XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  // mkostemp opens with O_CREAT|O_EXCL: it never opens a file that exists, a symlink included.
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0)
    return FailedPrecondition("cannot write " + named + ": cannot create a temporary file in " +
                              Directory(path) + ": " + std::strerror(errno));
  const std::string tmp(name.data());
  int failed = 0;
  if (::fchmod(fd, mode) != 0) failed = errno;
  for (size_t done = 0; !failed && done < contents.size();) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed = n < 0 ? errno : EIO;
    else done += static_cast<size_t>(n);
  }
  if (!failed && ::fsync(fd) != 0) failed = errno;
  if (::close(fd) != 0 && !failed) failed = errno;
  if (!failed && ::rename(tmp.c_str(), path.c_str()) != 0) failed = errno;
  if (failed) {
    ::unlink(tmp.c_str());
    return FailedPrecondition("cannot write " + named + ": " + std::strerror(failed));
  }
  // The rename is durable once the directory is flushed.
  const int dir = ::open(Directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    const bool synced = ::fsync(dir) == 0;
    const int error = errno;
    ::close(dir);
    if (!synced && error != EINVAL)  // some file systems cannot flush a directory
      return FailedPrecondition("cannot write " + named + ": flushing its directory: " +
                                std::strerror(error));
  }
  return Status::Ok();
}

}  // namespace regroup
