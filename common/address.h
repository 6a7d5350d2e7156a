// SPDX-License-Identifier: Apache-2.0
// Checking a HOST:PORT address given on a command line before anything listens or connects, so
// a typo is an error naming the flag instead of a server on some other port.
#pragma once

#include <string_view>

#include "common/status.h"

namespace regroup {

// `address` is HOST:PORT or [IPV6]:PORT with a port from 0 (any free port, when
// `port_zero_allowed`) to 65535 and a non-empty host. The error names `flag` and the value.
Status CheckHostPort(std::string_view address, std::string_view flag, bool port_zero_allowed);

// Whether the host of a HOST:PORT (or [IPV6]:PORT) address is a loopback one: 127.0.0.0/8,
// ::1 or "localhost". Only such an address keeps a server off the network.
bool IsLoopbackAddress(std::string_view address);

}  // namespace regroup
