// SPDX-License-Identifier: Apache-2.0
#include "common/address.h"

#include <charconv>
#include <string>

namespace regroup {

Status CheckHostPort(std::string_view address, std::string_view flag, bool port_zero_allowed) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(std::string(flag) + " \"" + std::string(address) + "\": " + why);
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return bad("give HOST:PORT");
  std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string_view::npos) return bad("write an IPv6 host in brackets, [::1]:PORT");
  if (host.empty()) return bad("the host is empty");
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
    return bad("the port must be a number from " + std::string(port_zero_allowed ? "0" : "1") +
               " to 65535");
  if (value == 0 && !port_zero_allowed) return bad("the port must be from 1 to 65535");
  return Status::Ok();
}

bool IsLoopbackAddress(std::string_view address) {
  std::string_view host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

}  // namespace regroup
