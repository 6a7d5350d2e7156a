/* SPDX-License-Identifier: Apache-2.0 */
/* header_c11.c: compiles abi/regroup.h as strict C11 (-std=c11 -Wall -Wextra -pedantic -Werror,
 * see CMakeLists.txt) and uses every macro of the header, so a header that is not plain C fails
 * the build. It does not link the library: run as a test it checks the macros' values only. */
#include "regroup.h"

#include <stdio.h>
#include <string.h>

/* The status table expands to names and messages as the library's own switch does. */
#define NAME_ITEM(name, value, message) {value, "REGROUP_" #name, message},
static const struct {
  int value;
  const char *name;
  const char *message;
} kStatuses[] = {REGROUP_STATUS_TABLE(NAME_ITEM)};

#define ENUM_CHECK_ITEM(name, value, message) \
  if ((int)REGROUP_##name != (value)) {          \
    fprintf(stderr, "REGROUP_%s is %d, not %d\n", #name, (int)REGROUP_##name, (value)); \
    failures++;                                   \
  }

int main(void) {
  int failures = 0;
  size_t i;
  regroup_engine_options options = REGROUP_ENGINE_OPTIONS_INIT;
  regroup_decision decision = REGROUP_DECISION_INIT;
  regroup_coordinator_options coordinator = REGROUP_COORDINATOR_OPTIONS_INIT;
  regroup_status status = REGROUP_OK;
  uint32_t version = REGROUP_ABI_VERSION;

  REGROUP_STATUS_TABLE(ENUM_CHECK_ITEM)
  for (i = 0; i < sizeof kStatuses / sizeof kStatuses[0]; ++i) {
    if (kStatuses[i].value != (int)i || strncmp(kStatuses[i].name, "REGROUP_", 8) != 0 ||
        kStatuses[i].message[0] == '\0') {
      fprintf(stderr, "status table entry %u is out of order or empty\n", (unsigned)i);
      failures++;
    }
  }
  if (version != ((uint32_t)REGROUP_ABI_VERSION_MAJOR << 16 | REGROUP_ABI_VERSION_MINOR)) {
    fprintf(stderr, "REGROUP_ABI_VERSION does not match its major and minor\n");
    failures++;
  }
  if (options.version != REGROUP_ENGINE_OPTIONS_VERSION || options.max_jobs != 0 ||
      options.max_input_bytes != 0 || options.history_length != 0) {
    fprintf(stderr, "REGROUP_ENGINE_OPTIONS_INIT does not set the version and zeros\n");
    failures++;
  }
  if (decision.version != REGROUP_DECISION_VERSION || decision.phase != REGROUP_PHASE_RUNNING ||
      decision.kind != REGROUP_DIRECTIVE_CONTINUE || decision.deadline_ms != -1 ||
      decision.dp != 0 || decision.evictions != 0) {
    fprintf(stderr, "REGROUP_DECISION_INIT does not set the version and defaults\n");
    failures++;
  }
  if (coordinator.version != REGROUP_COORDINATOR_OPTIONS_VERSION || coordinator.listen != NULL ||
      coordinator.credential != NULL || coordinator.tls_cert_file != NULL ||
      coordinator.tls_key_file != NULL || coordinator.tls_client_ca_file != NULL) {
    fprintf(stderr, "REGROUP_COORDINATOR_OPTIONS_INIT does not set the version and NULLs\n");
    failures++;
  }
  /* Option structs grow only at their end: `version` stays first. */
  if (offsetof(regroup_engine_options, version) != 0 || offsetof(regroup_decision, version) != 0 ||
      offsetof(regroup_coordinator_options, version) != 0) {
    fprintf(stderr, "an options struct does not start with its version\n");
    failures++;
  }
  (void)status;
  if (failures) return 1;
  printf("regroup.h compiles as C11; ABI %u.%u\n", (unsigned)REGROUP_ABI_VERSION_MAJOR,
         (unsigned)REGROUP_ABI_VERSION_MINOR);
  return 0;
}
