// SPDX-License-Identifier: Apache-2.0
// A file of this repository, for tests that read examples (REGROUP_SOURCE_DIR is the source root).
#ifndef REGROUP_TESTS_SOURCE_FILE_H_
#define REGROUP_TESTS_SOURCE_FILE_H_

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace regroup::testing {

// The file's text; a missing file fails the test (rather than reading as empty).
inline std::string ReadSourceFile(const std::string& relative) {
  const std::string path = std::string(REGROUP_SOURCE_DIR) + "/" + relative;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace regroup::testing

#endif  // REGROUP_TESTS_SOURCE_FILE_H_
