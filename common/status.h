// SPDX-License-Identifier: Apache-2.0
// Status and StatusOr for the library's C++ core. Codes are the C ABI's (abi/regroup.h), so a
// status crosses the ABI unchanged.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "abi/regroup.h"

#define REGROUP_RETURN_IF_ERROR(expr)     \
  do {                                    \
    ::regroup::Status status_ = (expr);   \
    if (!status_.ok()) return status_;    \
  } while (0)

namespace regroup {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(regroup_status code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == REGROUP_OK; }
  regroup_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  regroup_status code_ = REGROUP_OK;
  std::string message_;
};

inline Status InvalidArgument(std::string message) {
  return {REGROUP_INVALID_ARGUMENT, std::move(message)};
}
inline Status NotFound(std::string message) { return {REGROUP_NOT_FOUND, std::move(message)}; }
inline Status FailedPrecondition(std::string message) {
  return {REGROUP_FAILED_PRECONDITION, std::move(message)};
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : value_(std::move(status)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(value_); }
  T& value() { return std::get<T>(value_); }
  const T& value() const { return std::get<T>(value_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace regroup
