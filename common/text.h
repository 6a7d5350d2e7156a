// SPDX-License-Identifier: Apache-2.0
// Text from a peer made safe to keep and send on: valid UTF-8 (which proto3 strings require)
// and bounded in size, since it ends up in events, logs, reasons and persisted state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace regroup {

// The most bytes a fault's free-text detail keeps at every hop (agent, manager, coordinator).
inline constexpr size_t kMaxDetailBytes = 4096;

// The length of the valid UTF-8 character at `text[i]` (1 to 4), or 0 when the bytes there are
// not one: a bad lead or continuation byte, a cut sequence, an overlong form, a surrogate or a
// value past U+10FFFF. The one UTF-8 decoder of the project.
size_t Utf8CharLength(std::string_view text, size_t i);

// The offset of the first byte that is not part of valid UTF-8, or npos when all of `text` is.
// Readers of text that becomes JSON (YAML jobs, fault scripts) refuse what fails this.
size_t InvalidUtf8At(std::string_view text);

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
std::string ValidUtf8(std::string_view text);

// ValidUtf8(text) cut to at most `limit` bytes at a character boundary; a cut text ends with
// " [N bytes cut]" (counted within the limit), so a reader knows it is not whole.
std::string BoundedText(std::string_view text, size_t limit);

// BoundedText(text, limit) fit for one line of a text log: each control character (a newline
// that would forge a second line, a tab, an escape sequence) written as \n, \r, \t or \xNN, and
// a backslash as \\.
std::string OneLine(std::string_view text, size_t limit);

}  // namespace regroup
