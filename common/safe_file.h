// SPDX-License-Identifier: Apache-2.0
// Writing a file so that neither a crash nor a hostile neighbour in its directory can hurt: every
// file Regroup's programs write (the manager's record, port files, regroupctl's output) goes
// through WriteFileAtomically.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace regroup {

// Writes `contents` to `path`: into a new temporary file in the same directory, created with
// O_CREAT|O_EXCL (mkostemp: a name nobody holds, and a symlink planted at any name is never
// followed), flushed (fsync), renamed over `path` (a symlink at `path` itself is replaced, never
// followed), then the directory is flushed so the rename survives a crash. A reader sees the old
// file or the new one, never half of one. `mode` is the new file's permissions. An error names
// the `what` (when not empty) and the path; the temporary is removed.
Status WriteFileAtomically(const std::string& path, std::string_view contents,
                           std::string_view what, mode_t mode = 0600);

}  // namespace regroup
