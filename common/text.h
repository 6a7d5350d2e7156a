// Text from a peer made safe to keep and send on: valid UTF-8 (which proto3 strings require)
// and bounded in size, since it ends up in events, logs, reasons and persisted state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace regroup {

// The most bytes a fault's free-text detail keeps at every hop (agent, manager, coordinator).
inline constexpr size_t kMaxDetailBytes = 4096;

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
std::string ValidUtf8(std::string_view text);

// ValidUtf8(text) cut to at most `limit` bytes at a character boundary; a cut text ends with
// " [N bytes cut]" (counted within the limit), so a reader knows it is not whole.
std::string BoundedText(std::string_view text, size_t limit);

}  // namespace regroup
