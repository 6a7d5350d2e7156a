// SPDX-License-Identifier: Apache-2.0
#include "common/text.h"

#include <cstdint>

namespace regroup {

size_t Utf8CharLength(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  const size_t len = c < 0x80          ? 1
                     : (c >> 5) == 0x6   ? 2
                     : (c >> 4) == 0xE   ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
  if (len == 0 || i + len > text.size()) return 0;
  uint32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(text[i + k]);
    if ((cc >> 6) != 0x2) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    return 0;
  return len;
}

size_t InvalidUtf8At(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t len = Utf8CharLength(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (const size_t len = Utf8CharLength(text, i)) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  return out;
}

std::string BoundedText(std::string_view text, size_t limit) {
  std::string valid = ValidUtf8(text);
  if (valid.size() <= limit) return valid;
  const std::string marker = " [" + std::to_string(valid.size()) + " bytes cut]";
  size_t end = limit > marker.size() ? limit - marker.size() : 0;
  while (end > 0 && (static_cast<unsigned char>(valid[end]) & 0xC0) == 0x80) --end;
  valid.resize(end);
  if (valid.size() + marker.size() <= limit) valid += marker;
  return valid;
}

std::string OneLine(std::string_view text, size_t limit) {
  const std::string bounded = BoundedText(text, limit);
  std::string line;
  line.reserve(bounded.size());
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : bounded) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') line += "\\\\";
    else if (c == '\n') line += "\\n";
    else if (c == '\r') line += "\\r";
    else if (c == '\t') line += "\\t";
    else if (u < 0x20 || u == 0x7f) (line += "\\x") += {kHex[u >> 4], kHex[u & 15]};
    else line += c;
  }
  return line;
}

}  // namespace regroup
