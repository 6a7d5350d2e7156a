/* SPDX-License-Identifier: Apache-2.0 */
/* c_program.c: a plain C11 caller of libregroup.so, as the Volcano plugin is through cgo.
 *
 * It calls every function of abi/regroup.h at least once, checks every result, and drives one
 * recovery scenario end to end: a node fails, the job waits for a replacement, scales in at the
 * deadline and scales out when the replacement registers; and it starts a coordinator on the
 * loopback. It also passes NULL handles, NULL
 * strings, malformed JSON and bad enum values everywhere: each must give a status and an error
 * object, never a crash. Exits 1, naming every mismatch, when anything differs. */
#include "regroup.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Checking
 * ------------------------------------------------------------------------------------------- */
static int checks = 0;
static int failures = 0;

static void fail(int line, const char *format, ...) {
  va_list args;
  fprintf(stderr, "c_program.c:%d: ", line);
  va_start(args, format);
  vfprintf(stderr, format, args);
  va_end(args);
  fputc('\n', stderr);
  ++failures;
}

#define CHECK(cond)                                          \
  do {                                                       \
    ++checks;                                                \
    if (!(cond)) fail(__LINE__, "check failed: %s", #cond); \
  } while (0)

#define CHECK_EQ_INT(got, want)                                                             \
  do {                                                                                      \
    long long got_ = (long long)(got), want_ = (long long)(want);                           \
    ++checks;                                                                               \
    if (got_ != want_) fail(__LINE__, "%s is %lld, want %lld", #got, got_, want_);         \
  } while (0)

/* Checks a call's status and error object, then frees the error. `needle`, when not NULL, must
 * occur in the error's message. */
static void expect_status(int line, const char *call, regroup_status got, regroup_status want,
                          regroup_error *err, const char *needle) {
  ++checks;
  if (got != want) {
    fail(line, "%s\n  returned %s, want %s (error: %s)", call, regroup_status_name(got),
         regroup_status_name(want), err ? regroup_error_message(err) : "none");
  } else if (want == REGROUP_OK) {
    if (err) fail(line, "%s\n  returned REGROUP_OK with an error object", call);
  } else if (!err) {
    fail(line, "%s\n  returned %s without an error object", call, regroup_status_name(got));
  } else if (regroup_error_status(err) != want) {
    fail(line, "%s\n  returned %s, its error object says %s", call, regroup_status_name(got),
         regroup_status_name(regroup_error_status(err)));
  } else if (regroup_error_message(err) == NULL || regroup_error_message(err)[0] == '\0') {
    fail(line, "%s\n  returned %s with an empty message", call, regroup_status_name(got));
  } else if (needle && !strstr(regroup_error_message(err), needle)) {
    fail(line, "%s\n  error message \"%s\" does not contain \"%s\"", call,
         regroup_error_message(err), needle);
  }
  regroup_error_free(err);
}

/* EXPECT(status, call): `call` passes `&err`, declared here. */
#define EXPECT(want, call)                                                 \
  do {                                                                     \
    regroup_error *err = NULL;                                             \
    regroup_status st_ = (call);                                           \
    expect_status(__LINE__, #call, st_, (want), err, NULL);                \
  } while (0)
#define EXPECT_MSG(want, needle, call)                                     \
  do {                                                                     \
    regroup_error *err = NULL;                                             \
    regroup_status st_ = (call);                                           \
    expect_status(__LINE__, #call, st_, (want), err, (needle));            \
  } while (0)

static int contains(const char *text, const char *needle) {
  return text != NULL && strstr(text, needle) != NULL;
}

#define CHECK_CONTAINS(text, needle)                                                          \
  do {                                                                                        \
    ++checks;                                                                                 \
    if (!contains((text), (needle)))                                                          \
      fail(__LINE__, "%s does not contain %s:\n  %s", #text, (needle),                       \
           (text) ? (text) : "(null)");                                                       \
  } while (0)

#define CHECK_STREQ(a, b)                                                                     \
  do {                                                                                        \
    const char *a_ = (a), *b_ = (b);                                                          \
    ++checks;                                                                                 \
    if (!a_ || !b_ || strcmp(a_, b_) != 0)                                                    \
      fail(__LINE__, "%s != %s:\n  %s\n  %s", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
  } while (0)

/* A sentinel a failing call must overwrite with NULL. */
static char sentinel_byte;
#define SENTINEL (&sentinel_byte)

/* ---------------------------------------------------------------------------------------------
 * Inputs
 * ------------------------------------------------------------------------------------------- */
/* The job of the README's example: tp = pp = 1 and 2 processes per pod, so 8 replicas. */
static const char kJob[] =
    "{\"id\":\"default/demo\",\"uid\":\"u1\",\"labels\":{\"fault-scheduling\":\"force\"},"
    "\"annotations\":{\"recover-strategy\":\"recover,elastic-training\","
    "\"wait-reschedule-timeout\":\"30\"},\"pods\":4,\"processes_per_pod\":2}";

/* The scenario's job: the same keys with tensor-parallel 2, so one replica per pod (dp 4). */
static const char kTrainJob[] =
    "{\"id\":\"default/train\",\"uid\":\"t1\",\"labels\":{\"fault-scheduling\":\"force\"},"
    "\"annotations\":{\"recover-strategy\":\"recover,elastic-training\","
    "\"wait-reschedule-timeout\":\"30\",\"regroup.io/tensor-parallel\":\"2\"},"
    "\"pods\":4,\"processes_per_pod\":2}";
/* The same job with a replica of 3 ranks that does not line up with 2 processes per pod. */
static const char kTrainJobBad[] =
    "{\"id\":\"default/train\",\"uid\":\"t1\",\"labels\":{\"fault-scheduling\":\"force\"},"
    "\"annotations\":{\"recover-strategy\":\"recover,elastic-training\","
    "\"wait-reschedule-timeout\":\"30\",\"regroup.io/tensor-parallel\":\"3\"},"
    "\"pods\":4,\"processes_per_pod\":2}";
/* A second job: replicas of 4 ranks, two pods each (dp 2). */
static const char kOtherJob[] =
    "{\"id\":\"default/other\",\"uid\":\"o1\",\"labels\":{\"fault-scheduling\":\"grace\"},"
    "\"annotations\":{\"recover-strategy\":\"recover,elastic-training\","
    "\"wait-reschedule-timeout\":\"30\",\"regroup.io/tensor-parallel\":\"4\"},"
    "\"pods\":4,\"processes_per_pod\":2}";

static size_t len(const char *s) { return strlen(s); }
/* A string literal and its length, as two arguments. */
#define TXT(s) (s), strlen(s)

/* ---------------------------------------------------------------------------------------------
 * Sections
 * ------------------------------------------------------------------------------------------- */
static void test_versions_and_statuses(void) {
  uint32_t abi = regroup_abi_version();
  uint32_t built_minor = REGROUP_ABI_VERSION_MINOR; /* a variable: minor 0 makes >= trivial */
  const char *release = regroup_version_string();
  CHECK_EQ_INT(abi >> 16, REGROUP_ABI_VERSION_MAJOR);
  CHECK((abi & 0xffffu) >= built_minor);
  CHECK(release != NULL && release[0] >= '0' && release[0] <= '9' && strchr(release, '.'));

#define STATUS_ITEM(name, value, message)                           \
  CHECK_STREQ(regroup_status_name(REGROUP_##name), "REGROUP_" #name); \
  CHECK_STREQ(regroup_status_message(REGROUP_##name), message);
  REGROUP_STATUS_TABLE(STATUS_ITEM)
#undef STATUS_ITEM
  CHECK_STREQ(regroup_status_name((regroup_status)99), "REGROUP_UNKNOWN_STATUS");
  CHECK_STREQ(regroup_status_name((regroup_status)-1), "REGROUP_UNKNOWN_STATUS");
  CHECK(regroup_status_message((regroup_status)99) != NULL &&
        regroup_status_message((regroup_status)99)[0] != '\0');

  /* Error accessors and every free function accept NULL. */
  CHECK_EQ_INT(regroup_error_status(NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_STREQ(regroup_error_message(NULL), "");
  regroup_error_free(NULL);
  regroup_string_free(NULL);
  regroup_engine_free(NULL);
}

static void test_validate(void) {
  char *report = SENTINEL;
  char buffer[1024];
  const char *warned =
      "{\"id\":\"a/b\",\"pods\":2,\"annotations\":{\"wait-reschedule-timeout\":\"5\"}}";

  EXPECT(REGROUP_OK, regroup_validate_job(&report, kJob, len(kJob), &err));
  CHECK_CONTAINS(report, "\"ok\":true");
  CHECK_CONTAINS(report, "\"problems\":[]");
  CHECK_CONTAINS(report, "\"recover-strategy\":\"recover,elastic-training,exit\"");
  regroup_string_free(report);

  /* The report is optional, and so is the error. */
  EXPECT(REGROUP_OK, regroup_validate_job(NULL, kJob, len(kJob), &err));
  CHECK_EQ_INT(regroup_validate_job(NULL, kJob, len(kJob), NULL), REGROUP_OK);

  /* `len` bounds the input: it need not be NUL-terminated. */
  memset(buffer, 'x', sizeof buffer);
  memcpy(buffer, kJob, len(kJob));
  EXPECT(REGROUP_OK, regroup_validate_job(NULL, buffer, len(kJob), &err));

  /* A MindCluster key with a bad value is a warning; the job is still OK. */
  report = SENTINEL;
  EXPECT(REGROUP_OK, regroup_validate_job(&report, warned, len(warned), &err));
  CHECK_CONTAINS(report, "\"severity\":\"warning\"");
  CHECK_CONTAINS(report, "\"wait-reschedule-timeout\":\"270\"");
  regroup_string_free(report);

  /* An invalid job: VALIDATION_FAILED, and the report is still written. */
  report = SENTINEL;
  EXPECT_MSG(REGROUP_VALIDATION_FAILED, "default/train",
             regroup_validate_job(&report, kTrainJobBad, len(kTrainJobBad), &err));
  CHECK_CONTAINS(report, "\"ok\":false");
  CHECK_CONTAINS(report, "\"severity\":\"error\"");
  CHECK_CONTAINS(report, "\"key\":\"regroup.io/tensor-parallel\"");
  regroup_string_free(report);
  CHECK_EQ_INT(regroup_validate_job(NULL, kTrainJobBad, len(kTrainJobBad), NULL),
               REGROUP_VALIDATION_FAILED);

  /* Not a job spec at all: INVALID_ARGUMENT and no report. */
  report = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_validate_job(&report, TXT("{\"id\":"), &err));
  CHECK(report == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_validate_job(NULL, TXT("[]"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_validate_job(NULL, TXT(""), &err));
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "pods",
             regroup_validate_job(NULL, TXT("{\"id\":\"a/b\"}"), &err));
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "pods",
             regroup_validate_job(NULL, TXT("{\"id\":\"a/b\",\"pods\":\"4\"}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_validate_job(NULL, TXT("{\"id\":\"a/b\",\"pods\":1e400}"), &err));
  report = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_validate_job(&report, NULL, 10, &err));
  CHECK(report == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_validate_job(NULL, NULL, 0, &err));
  CHECK_EQ_INT(regroup_validate_job(NULL, NULL, 0, NULL), REGROUP_INVALID_ARGUMENT);
}

/* Since 1.2: the rules a scheduler plugin shares with regroupctl. */
static void test_reading_jobs(void) {
  const char *mindcluster_label[] = {"app", "fault-scheduling"};
  const char *regroup_annotation[] = {"regroup.io/prefer-elastic"};
  const char *plain[] = {"app", "team"};
  const char *misplaced[] = {"recover-strategy"}; /* an annotation key, as a label */
  const char *with_null[] = {"app", NULL};
  uint8_t has = 7;
  char *out = SENTINEL;
  const char *volcano_job =
      "{\"apiVersion\":\"batch.volcano.sh/v1alpha1\",\"kind\":\"Job\","
      "\"metadata\":{\"name\":\"train\",\"namespace\":\"ml\",\"uid\":\"u9\","
      "\"labels\":{\"fault-scheduling\":\"force\"},"
      "\"annotations\":{\"recover-strategy\":\"recover\"}},"
      "\"spec\":{\"minAvailable\":3,\"tasks\":["
      "{\"name\":\"manager\",\"replicas\":1,\"template\":{\"spec\":{\"containers\":"
      "[{\"command\":[\"regroup-manager\"]}]}}},"
      "{\"name\":\"worker\",\"replicas\":2,\"template\":{\"spec\":{\"containers\":"
      "[{\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"4\"}},"
      "\"env\":[{\"name\":\"MINDIO_WAIT_MINDX_TIME\",\"value\":\"60\"}]}]}}}]}}";
  const char *manager_only =
      "{\"kind\":\"Job\",\"metadata\":{\"name\":\"t\"},\"spec\":{\"tasks\":"
      "[{\"name\":\"manager\",\"replicas\":1}]}}";

  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, mindcluster_label, 2, NULL, 0, &err));
  CHECK_EQ_INT(has, 1);
  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, plain, 2, regroup_annotation, 1, &err));
  CHECK_EQ_INT(has, 1);
  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, plain, 2, plain, 2, &err));
  CHECK_EQ_INT(has, 0);
  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, misplaced, 1, NULL, 0, &err));
  CHECK_EQ_INT(has, 0);
  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, NULL, 0, misplaced, 1, &err));
  CHECK_EQ_INT(has, 1);
  EXPECT(REGROUP_OK, regroup_job_has_keys(&has, NULL, 0, NULL, 0, &err));
  CHECK_EQ_INT(has, 0);
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "label key 1 is NULL",
             regroup_job_has_keys(&has, with_null, 2, NULL, 0, &err));
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "annotation key list is NULL",
             regroup_job_has_keys(&has, NULL, 0, NULL, 3, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_job_has_keys(NULL, plain, 2, NULL, 0, &err));
  CHECK_EQ_INT(regroup_job_has_keys(NULL, NULL, 0, NULL, 0, NULL), REGROUP_INVALID_ARGUMENT);

  EXPECT(REGROUP_OK, regroup_volcano_job_read(&out, volcano_job, len(volcano_job), &err));
  CHECK_CONTAINS(out, "\"id\":\"ml/train\"");
  CHECK_CONTAINS(out, "\"pods\":2");
  CHECK_CONTAINS(out, "\"processes_per_pod\":4");
  CHECK_CONTAINS(out, "\"manager_pods\":1");
  CHECK_CONTAINS(out, "\"min_available\":3");
  CHECK_CONTAINS(out, "\"MINDIO_WAIT_MINDX_TIME\":\"60\"");
  CHECK_CONTAINS(out, "\"manager_tasks\":[0]");
  regroup_string_free(out);
  out = SENTINEL;
  EXPECT(REGROUP_OK, regroup_volcano_job_read(&out, manager_only, len(manager_only), &err));
  CHECK_CONTAINS(out, "\"pods\":0");
  regroup_string_free(out);
  out = SENTINEL;
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "kind",
             regroup_volcano_job_read(&out, TXT("{\"kind\":\"Pod\"}"), &err));
  CHECK(out == NULL);
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "replicas",
             regroup_volcano_job_read(&out, TXT("{\"kind\":\"Job\",\"metadata\":{\"name\":"
                                                "\"t\"},\"spec\":{\"tasks\":[{\"replicas\":"
                                                "\"many\"}]}}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_volcano_job_read(&out, TXT("{\"kind\": [}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_volcano_job_read(&out, TXT(""), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_volcano_job_read(&out, NULL, 4, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_volcano_job_read(NULL, TXT("{}"), &err));
  CHECK_EQ_INT(regroup_volcano_job_read(NULL, NULL, 0, NULL), REGROUP_INVALID_ARGUMENT);
}

static void test_engine_new(void) {
  regroup_engine *engine = NULL;
  regroup_engine_options options = REGROUP_ENGINE_OPTIONS_INIT;
  char *report = NULL;

  EXPECT(REGROUP_OK, regroup_engine_new(&engine, NULL, &err));
  CHECK(engine != NULL);
  regroup_engine_free(engine);

  engine = NULL;
  EXPECT(REGROUP_OK, regroup_engine_new(&engine, &options, &err));
  CHECK(engine != NULL);
  regroup_engine_free(engine);

  /* An options version this library does not know. */
  engine = (regroup_engine *)SENTINEL;
  options.version = REGROUP_ENGINE_OPTIONS_VERSION + 1;
  EXPECT_MSG(REGROUP_VERSION_MISMATCH, "version",
             regroup_engine_new(&engine, &options, &err));
  CHECK(engine == NULL);
  options.version = 0;
  EXPECT(REGROUP_VERSION_MISMATCH, regroup_engine_new(&engine, &options, &err));
  CHECK(engine == NULL);
  CHECK_EQ_INT(regroup_engine_new(&engine, &options, NULL), REGROUP_VERSION_MISMATCH);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_new(NULL, NULL, &err));

  /* The limits of the options. */
  options.version = REGROUP_ENGINE_OPTIONS_VERSION;
  options.max_jobs = 1;
  options.max_input_bytes = 4096;
  EXPECT(REGROUP_OK, regroup_engine_new(&engine, &options, &err));
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, NULL, kJob, len(kJob), 0, &err));
  EXPECT(REGROUP_RESOURCE_EXHAUSTED,
         regroup_engine_upsert_job(engine, &report, kTrainJob, len(kTrainJob), 0, &err));
  regroup_string_free(report);
  {
    static char big[8192];
    memset(big, ' ', sizeof big);
    memcpy(big, kTrainJob, len(kTrainJob));
    EXPECT(REGROUP_RESOURCE_EXHAUSTED,
           regroup_engine_upsert_job(engine, NULL, big, sizeof big, 0, &err));
    EXPECT(REGROUP_RESOURCE_EXHAUSTED, regroup_engine_apply_events(engine, big, sizeof big, 0, &err));
  }
  regroup_engine_free(engine);
}

/* The typed decision of `job`, checked field by field. */
static void expect_decision(int line, regroup_engine *engine, const char *job, regroup_phase phase,
                            regroup_directive_kind kind, int64_t deadline_ms, uint32_t dp,
                            uint32_t gang_min, uint32_t wants_pods, uint32_t evictions) {
  regroup_decision d = REGROUP_DECISION_INIT;
  regroup_error *err = NULL;
  regroup_status st = regroup_engine_decision(engine, &d, job, &err);
  expect_status(line, "regroup_engine_decision", st, REGROUP_OK, err, NULL);
  if (st != REGROUP_OK) return;
  ++checks;
  if (d.phase != phase || d.kind != kind || d.deadline_ms != deadline_ms || d.dp != dp ||
      d.gang_min != gang_min || d.wants_pods != wants_pods || d.evictions != evictions)
    fail(line,
         "decision of %s: phase %d kind %d deadline %lld dp %u gang_min %u wants_pods %u "
         "evictions %u; want phase %d kind %d deadline %lld dp %u gang_min %u wants_pods %u "
         "evictions %u",
         job, (int)d.phase, (int)d.kind, (long long)d.deadline_ms, (unsigned)d.dp,
         (unsigned)d.gang_min, (unsigned)d.wants_pods, (unsigned)d.evictions, (int)phase,
         (int)kind, (long long)deadline_ms, (unsigned)dp, (unsigned)gang_min,
         (unsigned)wants_pods, (unsigned)evictions);
}

static char *decision_json(regroup_engine *engine, const char *job) {
  char *out = NULL;
  EXPECT(REGROUP_OK, regroup_engine_decision_json(engine, &out, job, &err));
  return out;
}

static char *export_state(regroup_engine *engine, const char *job) {
  char *out = NULL;
  EXPECT(REGROUP_OK, regroup_engine_export_job_state(engine, &out, job, &err));
  return out;
}

static char *snapshot(regroup_engine *engine) {
  char *out = NULL;
  EXPECT(REGROUP_OK, regroup_engine_snapshot(engine, &out, &err));
  return out;
}

static uint32_t tick(regroup_engine *engine, int64_t now_ms) {
  uint32_t changed = 12345;
  EXPECT(REGROUP_OK, regroup_engine_tick(engine, now_ms, &changed, &err));
  return changed;
}

/* Every call that takes an engine, a job id or a string, given NULL. */
static void test_null_arguments(regroup_engine *engine) {
  const char *nodes[] = {"n0"};
  uint8_t allowed[1];
  int32_t scores[1];
  char *out;
  regroup_decision d = REGROUP_DECISION_INIT;
  const char *job = "default/train";
  const char *event = "{\"type\":\"node\",\"node\":\"n9\",\"health\":\"healthy\"}";

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(NULL, NULL, kJob, len(kJob), 0, &err));
  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(NULL, &out, kJob, len(kJob), 0, &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(engine, NULL, NULL, 0, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(engine, NULL, NULL, 100, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(engine, NULL, TXT(""), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_upsert_job(engine, NULL, TXT("{\"id\":1}"), 0, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_remove_job(NULL, job, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_remove_job(engine, NULL, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(NULL, event, len(event), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, NULL, 0, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, NULL, 10, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, TXT(""), 0, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_node_health(NULL, "n0", REGROUP_NODE_HEALTHY, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_node_health(engine, NULL, REGROUP_NODE_HEALTHY, NULL, 0, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(NULL, job, 0, "p0", REGROUP_POD_RUNNING, "n0", 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, NULL, 0, "p0", REGROUP_POD_RUNNING, "n0", 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, job, 0, NULL, REGROUP_POD_RUNNING, "n0", 0, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_tick(NULL, 0, NULL, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision(NULL, &d, job, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision(engine, NULL, job, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision(engine, &d, NULL, &err));

  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision_json(NULL, &out, job, &err));
  CHECK(out == NULL);
  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision_json(engine, &out, NULL, &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_decision_json(engine, NULL, job, &err));
  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_history_json(NULL, &out, job, &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_history_json(engine, &out, NULL, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_history_json(engine, NULL, job, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_filter_nodes(NULL, allowed, job, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_filter_nodes(engine, allowed, NULL, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_filter_nodes(engine, NULL, job, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_filter_nodes(engine, allowed, job, NULL, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_score_nodes(NULL, scores, job, 0, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_score_nodes(engine, scores, NULL, 0, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_score_nodes(engine, NULL, job, 0, nodes, 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_score_nodes(engine, scores, job, 0, NULL, 1, &err));

  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_export_job_state(NULL, &out, job, &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_export_job_state(engine, &out, NULL, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_export_job_state(engine, NULL, job, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_import_job_state(NULL, job, TXT("{}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_import_job_state(engine, NULL, TXT("{}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_import_job_state(engine, job, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_import_job_state(engine, job, NULL, 2, &err));

  out = SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_snapshot(NULL, &out, &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_snapshot(engine, NULL, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_restore(NULL, TXT("{}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_restore(engine, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_restore(engine, NULL, 2, &err));

  /* The same failures with no error out-parameter. */
  CHECK_EQ_INT(regroup_engine_upsert_job(NULL, NULL, NULL, 0, 0, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_remove_job(engine, NULL, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_apply_events(engine, TXT("{"), 0, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_set_node_health(engine, NULL, REGROUP_NODE_FAULTY, NULL, 0, NULL),
               REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_set_pod_state(engine, job, 0, NULL, REGROUP_POD_RUNNING, NULL, 0,
                                            NULL),
               REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_tick(NULL, 0, NULL, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_decision(engine, NULL, job, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_decision_json(engine, NULL, NULL, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_history_json(engine, NULL, "default/none", NULL),
               REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_filter_nodes(engine, NULL, job, NULL, 3, NULL),
               REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_score_nodes(engine, NULL, job, 0, NULL, 3, NULL),
               REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_export_job_state(engine, NULL, job, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_import_job_state(engine, job, TXT("{"), NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_snapshot(NULL, NULL, NULL), REGROUP_INVALID_ARGUMENT);
  CHECK_EQ_INT(regroup_engine_restore(engine, TXT("["), NULL), REGROUP_INVALID_ARGUMENT);
}

/* Unknown jobs and bad values on an engine that has jobs. */
static void test_bad_values(regroup_engine *engine) {
  regroup_decision d = REGROUP_DECISION_INIT;
  char *out = SENTINEL;
  const char *nodes[] = {"n0"};
  uint8_t allowed[1];
  int32_t scores[1];
  const char *unknown_job = "{\"type\":\"pod\",\"job\":\"default/none\",\"index\":0,"
                            "\"uid\":\"x\",\"phase\":\"running\"}";
  const char *unknown_type = "{\"type\":\"reboot\",\"job\":\"default/train\"}";
  const char *not_event = "[1]";
  const char *bad_health = "{\"type\":\"node\",\"node\":\"n0\",\"health\":\"sick\"}";
  const char *bad_phase = "{\"type\":\"pod\",\"job\":\"default/train\",\"index\":0,"
                          "\"uid\":\"p0\",\"phase\":\"zombie\"}";
  const char *bad_index = "{\"type\":\"pod\",\"job\":\"default/train\",\"index\":-1,"
                          "\"uid\":\"p0\",\"phase\":\"running\"}";
  const char *bad_fault = "{\"type\":\"fault\",\"job\":\"default/train\",\"kind\":\"meteor\","
                          "\"pods\":[0]}";
  const char *fault_no_target = "{\"type\":\"fault\",\"job\":\"default/train\",\"kind\":\"hang\"}";

  EXPECT(REGROUP_NOT_FOUND, regroup_engine_remove_job(engine, "default/none", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_decision(engine, &d, "default/none", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_decision_json(engine, &out, "default/none", &err));
  CHECK(out == NULL);
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_history_json(engine, &out, "default/none", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_export_job_state(engine, &out, "default/none", &err));
  EXPECT(REGROUP_NOT_FOUND,
         regroup_engine_filter_nodes(engine, allowed, "default/none", nodes, 1, &err));
  EXPECT(REGROUP_NOT_FOUND,
         regroup_engine_score_nodes(engine, scores, "default/none", 0, nodes, 1, &err));
  EXPECT(REGROUP_NOT_FOUND,
         regroup_engine_set_pod_state(engine, "default/none", 0, "x", REGROUP_POD_RUNNING, NULL,
                                      0, &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_apply_events(engine, unknown_job, len(unknown_job), 0, &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_import_job_state(engine, "default/none", TXT("{}"), &err));

  /* Decision struct versions. */
  d.version = 0;
  EXPECT(REGROUP_VERSION_MISMATCH, regroup_engine_decision(engine, &d, "default/train", &err));
  d.version = REGROUP_DECISION_VERSION + 1;
  EXPECT(REGROUP_VERSION_MISMATCH, regroup_engine_decision(engine, &d, "default/train", &err));

  /* Enum values outside their enums, empty names, indices outside the job. */
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_node_health(engine, "n0", (regroup_node_health)7, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_node_health(engine, "n0", (regroup_node_health)-1, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_node_health(engine, "", REGROUP_NODE_FAULTY, NULL, 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, "default/train", 0, "p0", (regroup_pod_phase)9,
                                      "n0", 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, "default/train", 4, "p4", REGROUP_POD_RUNNING,
                                      "n0", 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, "default/train", UINT32_MAX, "p4",
                                      REGROUP_POD_RUNNING, "n0", 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_set_pod_state(engine, "default/train", 0, "", REGROUP_POD_RUNNING, "n0",
                                      0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_score_nodes(engine, scores, "default/train", 4, nodes, 1, &err));

  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, unknown_type, len(unknown_type), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, not_event, len(not_event), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, TXT("42"), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, bad_health, len(bad_health), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, bad_phase, len(bad_phase), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, bad_index, len(bad_index), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_apply_events(engine, bad_fault, len(bad_fault), 0, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_apply_events(engine, fault_no_target, len(fault_no_target), 0, &err));
}

static int position(const char *text, const char *needle) {
  const char *at = text ? strstr(text, needle) : NULL;
  return at ? (int)(at - text) : -1;
}

static void test_engine(void) {
  regroup_engine *engine = NULL, *copy = NULL;
  regroup_engine_options options = REGROUP_ENGINE_OPTIONS_INIT;
  char *report = NULL, *before = NULL, *after = NULL, *text = NULL, *state = NULL, *snap = NULL;
  uint32_t changed = 0;
  const char *nodes[] = {"n0", "n3", "never-seen", NULL, "spare"};
  uint8_t allowed[5] = {9, 9, 9, 9, 9};
  int32_t scores[3] = {-1, -1, -1};
  const char *m_nodes[] = {"m0", "m1", "m2"};

  const char *start =
      "[{\"type\":\"node\",\"node\":\"n1\",\"health\":\"healthy\"},"
      " {\"type\":\"node\",\"node\":\"n2\",\"health\":\"healthy\"},"
      " {\"type\":\"node\",\"node\":\"n3\",\"health\":\"healthy\",\"reason\":\"ready\"},"
      " {\"type\":\"pod\",\"job\":\"default/train\",\"index\":2,\"uid\":\"p2\","
      "\"phase\":\"running\",\"node\":\"n2\"},"
      " {\"type\":\"pod\",\"job\":\"default/train\",\"index\":3,\"uid\":\"p3\","
      "\"phase\":\"running\",\"node\":\"n3\"},"
      " {\"type\":\"pod\",\"job\":\"default/other\",\"index\":0,\"uid\":\"o0\","
      "\"phase\":\"running\",\"node\":\"m0\"},"
      " {\"type\":\"pod\",\"job\":\"default/other\",\"index\":1,\"uid\":\"o1\","
      "\"phase\":\"running\",\"node\":\"m1\"},"
      " {\"type\":\"pod\",\"job\":\"default/other\",\"index\":2,\"uid\":\"o2\","
      "\"phase\":\"running\",\"node\":\"m2\"},"
      " {\"type\":\"pod\",\"job\":\"default/other\",\"index\":3,\"uid\":\"o3\","
      "\"phase\":\"running\",\"node\":\"m3\"},"
      " {\"type\":\"manager_progress\",\"job\":\"default/train\",\"epoch\":1,\"generation\":1,"
      "\"committed_step\":5,\"live_ranks\":8}]";
  /* Event 2 is bad (no "health"); events 0 and 1 stay applied. */
  const char *partly_bad =
      "[{\"type\":\"node\",\"node\":\"spare\",\"health\":\"unknown\"},"
      " {\"type\":\"manager_progress\",\"job\":\"default/train\",\"epoch\":1,\"generation\":1,"
      "\"committed_step\":6},"
      " {\"type\":\"node\",\"node\":\"n9\"},"
      " {\"type\":\"node\",\"node\":\"n8\",\"health\":\"faulty\"}]";
  const char *other_fault =
      "{\"type\":\"fault\",\"job\":\"default/other\",\"kind\":\"process_exit\",\"ranks\":[1],"
      "\"step\":7,\"detail\":\"exit code 1\"}";
  const char *zombie =
      "{\"type\":\"replacement_registered\",\"job\":\"default/train\",\"index\":3,\"uid\":\"p3\"}";
  const char *replacement =
      "{\"type\":\"replacement_registered\",\"job\":\"default/train\",\"index\":3,\"uid\":\"p3b\"}";
  const char *settled =
      "{\"type\":\"manager_progress\",\"job\":\"default/train\",\"epoch\":1,\"generation\":2,"
      "\"committed_step\":20,\"live_ranks\":8}";

  options.history_length = 16;
  EXPECT(REGROUP_OK, regroup_engine_new(&engine, &options, &err));
  if (!engine) return;

  /* Jobs. */
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, &report, kTrainJob, len(kTrainJob), 0, &err));
  CHECK_CONTAINS(report, "\"ok\":true");
  regroup_string_free(report);
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, NULL, kOtherJob, len(kOtherJob), 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, NULL, kJob, len(kJob), 0, &err));
  expect_decision(__LINE__, engine, "default/demo", REGROUP_PHASE_RUNNING,
                  REGROUP_DIRECTIVE_CONTINUE, -1, 8, 4, 0, 0);
  EXPECT(REGROUP_OK, regroup_engine_remove_job(engine, "default/demo", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_remove_job(engine, "default/demo", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_decision_json(engine, &text, "default/demo", &err));

  test_null_arguments(engine);
  test_bad_values(engine);

  /* t = 0: pods 0..3 run on n0..n3. Typed and JSON paths both. */
  EXPECT(REGROUP_OK, regroup_engine_set_node_health(engine, "n0", REGROUP_NODE_HEALTHY, NULL, 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_set_node_health(engine, "n0", REGROUP_NODE_HEALTHY, "", 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(engine, "default/train", 0, "p0",
                                                  REGROUP_POD_RUNNING, "n0", 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(engine, "default/train", 1, "p1",
                                                  REGROUP_POD_BOUND, "n1", 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(engine, "default/train", 1, "p1",
                                                  REGROUP_POD_RUNNING, NULL, 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_apply_events(engine, start, len(start), 0, &err));
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_RUNNING,
                  REGROUP_DIRECTIVE_CONTINUE, -1, 4, 4, 0, 0);
  expect_decision(__LINE__, engine, "default/other", REGROUP_PHASE_RUNNING,
                  REGROUP_DIRECTIVE_CONTINUE, -1, 2, 4, 0, 0);

  /* An array stops at its first bad event, names its index, and keeps the events before it. */
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "event 2",
             regroup_engine_apply_events(engine, partly_bad, len(partly_bad), 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_filter_nodes(engine, allowed, "default/train", nodes, 5, &err));
  CHECK(allowed[0] == 1 && allowed[1] == 1 && allowed[2] == 1 && allowed[3] == 0 &&
        allowed[4] == 0);
  EXPECT(REGROUP_OK, regroup_engine_filter_nodes(engine, NULL, "default/train", NULL, 0, &err));
  {
    /* Event 3 (n8 faulty) was not applied. */
    const char *n8[] = {"n8"};
    EXPECT(REGROUP_OK, regroup_engine_filter_nodes(engine, allowed, "default/train", n8, 1, &err));
    CHECK_EQ_INT(allowed[0], 1);
  }

  {
    /* An event that passes the field checks but names what the job lacks (a rank, a pod, a
     * uid) is named by its index too. */
    const char *bad_rank =
        "[{\"type\":\"node\",\"node\":\"n1\",\"health\":\"healthy\"},"
        " {\"type\":\"fault\",\"job\":\"default/train\",\"kind\":\"hang\",\"ranks\":[99]}]";
    const char *bad_pod =
        "[{\"type\":\"node\",\"node\":\"n1\",\"health\":\"healthy\"},"
        " {\"type\":\"node\",\"node\":\"n2\",\"health\":\"healthy\"},"
        " {\"type\":\"pod\",\"job\":\"default/train\",\"index\":7,\"uid\":\"x\","
        "\"phase\":\"running\"}]";
    EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "event 1",
               regroup_engine_apply_events(engine, bad_rank, len(bad_rank), 0, &err));
    EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "event 2",
               regroup_engine_apply_events(engine, bad_pod, len(bad_pod), 0, &err));
  }

  /* Scores: 50 for a node hosting another pod of the same replica. */
  EXPECT(REGROUP_OK,
         regroup_engine_score_nodes(engine, scores, "default/other", 1, m_nodes, 3, &err));
  CHECK(scores[0] == 50 && scores[1] == 0 && scores[2] == 0);
  EXPECT(REGROUP_OK, regroup_engine_score_nodes(engine, NULL, "default/other", 1, NULL, 0, &err));

  CHECK_EQ_INT(tick(engine, 500), 0);

  /* A bad update keeps the accepted job as it was. */
  before = snapshot(engine);
  report = NULL;
  EXPECT_MSG(REGROUP_VALIDATION_FAILED, "default/train",
             regroup_engine_upsert_job(engine, &report, kTrainJobBad, len(kTrainJobBad), 600, &err));
  CHECK_CONTAINS(report, "\"ok\":false");
  regroup_string_free(report);
  after = snapshot(engine);
  CHECK_STREQ(before, after);
  regroup_string_free(after);
  /* A good update of the same job keeps its state. */
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, NULL, kTrainJob, len(kTrainJob), 600, &err));
  after = snapshot(engine);
  CHECK_STREQ(before, after);
  regroup_string_free(before);
  regroup_string_free(after);

  /* t = 1000: node n3 fails. Pod 3 is lost at once; the decision waits for the report window. */
  EXPECT(REGROUP_OK, regroup_engine_set_node_health(engine, "n3", REGROUP_NODE_FAULTY, "xid 79",
                                                    1000, &err));
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_RUNNING,
                  REGROUP_DIRECTIVE_CONTINUE, -1, 4, 4, 1, 1);
  CHECK_EQ_INT(tick(engine, 1100), 0);
  CHECK_EQ_INT(tick(engine, 1300), 1);
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_WAITING,
                  REGROUP_DIRECTIVE_WAIT, 31300, 4, 4, 1, 1);
  text = decision_json(engine, "default/train");
  CHECK_CONTAINS(text, "\"job\":\"default/train\"");
  CHECK_CONTAINS(text, "\"phase\":\"waiting\"");
  CHECK_CONTAINS(text, "\"kind\":\"wait\"");
  CHECK_CONTAINS(text, "\"deadline_ms\":31300");
  CHECK_CONTAINS(text, "\"strategy\":\"recover\"");
  CHECK_CONTAINS(text, "\"mode\":\"force\"");
  CHECK_CONTAINS(text, "\"uid\":\"p3\"");
  CHECK_CONTAINS(text, "\"node\":\"n3\"");
  CHECK_CONTAINS(text, "\"wants_pods\":true");
  CHECK_CONTAINS(text, "xid 79");
  regroup_string_free(text);
  {
    regroup_decision d = REGROUP_DECISION_INIT;
    EXPECT(REGROUP_OK, regroup_engine_decision(engine, &d, "default/train", &err));
    CHECK_EQ_INT(d.directive_id, 1);
    CHECK_EQ_INT(d.original_dp, 4);
  }

  /* Filter: the faulty node is out; unknown nodes and NULL names do not crash it. */
  memset(allowed, 9, sizeof allowed);
  EXPECT(REGROUP_OK, regroup_engine_filter_nodes(engine, allowed, "default/train", nodes, 5, &err));
  CHECK(allowed[0] == 1 && allowed[1] == 0 && allowed[2] == 1 && allowed[3] == 0 &&
        allowed[4] == 0);
  EXPECT(REGROUP_OK, regroup_engine_score_nodes(engine, scores, "default/train", 3, nodes, 2, &err));
  CHECK(scores[0] == 0 && scores[1] == 0);
  {
    const char *with_null[] = {NULL, "n0"};
    EXPECT(REGROUP_OK,
           regroup_engine_score_nodes(engine, scores, "default/train", 0, with_null, 2, &err));
    CHECK_EQ_INT(scores[0], 0);
  }

  /* A fault report for the other job: rank 1 lives on pod 0, which must be replaced. */
  EXPECT(REGROUP_OK, regroup_engine_apply_events(engine, other_fault, len(other_fault), 2000, &err));
  CHECK_EQ_INT(tick(engine, 2300), 1);
  expect_decision(__LINE__, engine, "default/other", REGROUP_PHASE_WAITING,
                  REGROUP_DIRECTIVE_WAIT, 32300, 2, 4, 1, 1);
  EXPECT(REGROUP_OK,
         regroup_engine_score_nodes(engine, scores, "default/other", 0, m_nodes, 3, &err));
  CHECK(scores[0] == 100 && scores[1] == 50 && scores[2] == 0);

  /* t = 31300: no replacement by the deadline: scale in to dp 3. */
  CHECK_EQ_INT(tick(engine, 31299), 0);
  CHECK_EQ_INT(tick(engine, 31300), 1);
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 3, 3, 1, 1);
  text = decision_json(engine, "default/train");
  CHECK_CONTAINS(text, "\"kind\":\"scale_in\"");
  CHECK_CONTAINS(text, "\"remove_replicas\":[3]");
  CHECK_CONTAINS(text, "\"keep_replicas\":[0,1,2]");
  regroup_string_free(text);

  /* Export the state now and restore it into a second engine, later. */
  state = export_state(engine, "default/train");
  CHECK_CONTAINS(state, "\"phase\":\"scaled_in\"");
  snap = snapshot(engine);

  /* The replacement pod appears, a zombie of the lost one is refused, the replacement
   * registers, and the next tick scales out to dp 4. */
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(engine, "default/train", 3, "p3b",
                                                  REGROUP_POD_RUNNING, "n4", 39000, &err));
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 3, 3, 1, 0);
  EXPECT_MSG(REGROUP_FAILED_PRECONDITION, "p3",
             regroup_engine_apply_events(engine, zombie, len(zombie), 39500, &err));
  EXPECT(REGROUP_OK, regroup_engine_apply_events(engine, replacement, len(replacement), 40000, &err));
  EXPECT(REGROUP_OK, regroup_engine_tick(engine, 40000, &changed, &err));
  CHECK_EQ_INT(changed, 2); /* default/train scales out; default/other's wait ran out */
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_SCALING_OUT,
                  REGROUP_DIRECTIVE_SCALE_OUT, -1, 4, 4, 0, 0);
  expect_decision(__LINE__, engine, "default/other", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 1, 2, 1, 1);
  EXPECT(REGROUP_OK, regroup_engine_tick(engine, 40001, NULL, &err));

  /* The manager reports a newer generation with a committed step: back to running. */
  EXPECT(REGROUP_OK, regroup_engine_apply_events(engine, settled, len(settled), 41000, &err));
  expect_decision(__LINE__, engine, "default/train", REGROUP_PHASE_RUNNING,
                  REGROUP_DIRECTIVE_SCALE_OUT, -1, 4, 4, 0, 0);

  /* The timeline: wait, scale_in, scale_out, oldest first. */
  text = NULL;
  EXPECT(REGROUP_OK, regroup_engine_history_json(engine, &text, "default/train", &err));
  CHECK(text && text[0] == '[');
  CHECK(position(text, "\"kind\":\"wait\"") >= 0);
  CHECK(position(text, "\"kind\":\"wait\"") < position(text, "\"kind\":\"scale_in\""));
  CHECK(position(text, "\"kind\":\"scale_in\"") < position(text, "\"kind\":\"scale_out\""));
  regroup_string_free(text);

  /* Import: the exported state into a fresh engine gives the same decision and state. */
  EXPECT(REGROUP_OK, regroup_engine_new(&copy, NULL, &err));
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(copy, NULL, kTrainJob, len(kTrainJob), 0, &err));
  EXPECT(REGROUP_OK, regroup_engine_import_job_state(copy, "default/train", state, len(state), &err));
  /* The state names pods by their uids' fingerprints: a restarted scheduler reports the pods it
   * sees, and the lost pod p3, still on n3, is evicted by its uid again. */
  expect_decision(__LINE__, copy, "default/train", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 3, 3, 1, 0);
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(copy, "default/train", 3, "p3",
                                                  REGROUP_POD_RUNNING, "n3", 31300, &err));
  expect_decision(__LINE__, copy, "default/train", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 3, 3, 1, 1);
  text = export_state(copy, "default/train");
  CHECK_STREQ(text, state);
  regroup_string_free(text);
  /* Refused: malformed, another job's state, another version. */
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_import_job_state(copy, "default/train", state, len(state) - 1, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_import_job_state(copy, "default/train", TXT("[]"), &err));
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(copy, NULL, kOtherJob, len(kOtherJob), 0, &err));
  EXPECT(REGROUP_FAILED_PRECONDITION,
         regroup_engine_import_job_state(copy, "default/other", state, len(state), &err));
  {
    char *v2 = malloc(len(state) + 1);
    char *at;
    memcpy(v2, state, len(state) + 1);
    at = strstr(v2, "\"version\":2");
    CHECK(at != NULL);
    if (at) at[10] = '3';
    EXPECT(REGROUP_VERSION_MISMATCH,
           regroup_engine_import_job_state(copy, "default/train", v2, len(v2), &err));
    free(v2);
  }
  /* A refused import changed nothing. */
  text = export_state(copy, "default/train");
  CHECK_STREQ(text, state);
  regroup_string_free(text);
  regroup_engine_free(copy);
  copy = NULL;

  /* Snapshot and restore: the same content, and a bad snapshot changes nothing. */
  EXPECT(REGROUP_OK, regroup_engine_new(&copy, NULL, &err));
  EXPECT(REGROUP_OK, regroup_engine_restore(copy, snap, len(snap), &err));
  text = snapshot(copy);
  CHECK_STREQ(text, snap);
  regroup_string_free(text);
  EXPECT(REGROUP_OK, regroup_engine_set_pod_state(copy, "default/train", 3, "p3",
                                                  REGROUP_POD_RUNNING, "n3", 31300, &err));
  expect_decision(__LINE__, copy, "default/train", REGROUP_PHASE_SCALED_IN,
                  REGROUP_DIRECTIVE_SCALE_IN, -1, 3, 3, 1, 1);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_restore(copy, snap, len(snap) / 2, &err));
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_engine_restore(copy, TXT("[]"), &err));
  EXPECT(REGROUP_VERSION_MISMATCH, regroup_engine_restore(copy, TXT("{\"version\":2}"), &err));
  EXPECT(REGROUP_INVALID_ARGUMENT,
         regroup_engine_restore(copy, TXT("{\"version\":1,\"jobs\":[{\"spec\":{}}]}"), &err));
  text = snapshot(copy);
  CHECK_STREQ(text, snap);
  regroup_string_free(text);
  /* Restoring an empty snapshot empties the engine. */
  EXPECT(REGROUP_OK, regroup_engine_restore(copy, TXT("{\"version\":1}"), &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_decision_json(copy, &text, "default/train", &err));
  regroup_engine_free(copy);

  /* Remove. */
  EXPECT(REGROUP_OK, regroup_engine_remove_job(engine, "default/train", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_remove_job(engine, "default/train", &err));
  EXPECT(REGROUP_NOT_FOUND, regroup_engine_decision_json(engine, &text, "default/train", &err));
  EXPECT(REGROUP_NOT_FOUND,
         regroup_engine_import_job_state(engine, "default/train", state, len(state), &err));

  regroup_string_free(state);
  regroup_string_free(snap);
  regroup_engine_free(engine);
}

/* The coordinator (ABI 1.1): a gRPC server over an engine, on a free port of the loopback. */
static void test_coordinator(void) {
  regroup_engine *engine = NULL;
  regroup_coordinator *coordinator = NULL;
  regroup_coordinator_options options = REGROUP_COORDINATOR_OPTIONS_INIT;
  int32_t port;

  EXPECT(REGROUP_OK, regroup_engine_new(&engine, NULL, &err));
  if (!engine) return;
  EXPECT(REGROUP_OK, regroup_engine_upsert_job(engine, NULL, kTrainJob, len(kTrainJob), 0, &err));

  options.listen = "127.0.0.1:0";
  options.credential = "s3cret";
  EXPECT(REGROUP_OK, regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator != NULL);
  port = regroup_coordinator_port(coordinator);
  CHECK(port > 0 && port < 65536);
  EXPECT(REGROUP_OK, regroup_coordinator_publish(coordinator, &err));
  CHECK_EQ_INT(tick(engine, 1000), 0);
  EXPECT(REGROUP_OK, regroup_coordinator_publish(coordinator, &err));
  /* No manager asked for a lease, and no state was saved: no holder waits to be stored (1.8). */
  CHECK_EQ_INT(regroup_coordinator_save_wanted(coordinator, "default/nope"), 0);
  CHECK_EQ_INT(regroup_coordinator_save_wanted(coordinator, NULL), 0);
  CHECK_EQ_INT(regroup_coordinator_save_wanted(NULL, "default/nope"), 0);
  regroup_coordinator_free(coordinator);

  /* No credential: refused unless insecure mode is asked for (ABI 1.3), which a version 1
   * struct and NULL options cannot do. */
  options.credential = NULL;
  coordinator = (regroup_coordinator *)SENTINEL;
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "no credential",
             regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, engine, NULL, &err));
  options.insecure = 1;
  options.version = 1;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, engine, &options, &err));
  options.version = REGROUP_COORDINATOR_OPTIONS_VERSION;
  EXPECT(REGROUP_OK, regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator != NULL);
  regroup_coordinator_free(coordinator);

  /* NULL arguments, versions, addresses and TLS files it cannot use: *out stays NULL. */
  coordinator = (regroup_coordinator *)SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, NULL, &options, &err));
  CHECK(coordinator == NULL);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(NULL, engine, &options, &err));
  CHECK_EQ_INT(regroup_coordinator_start(NULL, NULL, NULL, NULL), REGROUP_INVALID_ARGUMENT);
  options.version = REGROUP_COORDINATOR_OPTIONS_VERSION + 1;
  coordinator = (regroup_coordinator *)SENTINEL;
  EXPECT_MSG(REGROUP_VERSION_MISMATCH, "version",
             regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator == NULL);
  options.version = 0;
  EXPECT(REGROUP_VERSION_MISMATCH, regroup_coordinator_start(&coordinator, engine, &options, &err));
  options.version = REGROUP_COORDINATOR_OPTIONS_VERSION;
  options.listen = "192.0.2.1:0"; /* TEST-NET-1: not an address of this host */
  coordinator = (regroup_coordinator *)SENTINEL;
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator == NULL);
  options.listen = "127.0.0.1:0";
  options.tls_cert_file = "/nonexistent/regroup-cert.pem";
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, engine, &options, &err));
  options.tls_key_file = "/nonexistent/regroup-key.pem";
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator == NULL);
  /* A client CA (ABI 1.8) without the coordinator's own certificate and key; a version 3 struct
   * has no such field, and the library reads none. */
  options.tls_cert_file = NULL;
  options.tls_key_file = NULL;
  options.tls_client_ca_file = "/nonexistent/regroup-ca.pem";
  EXPECT_MSG(REGROUP_INVALID_ARGUMENT, "tls_client_ca_file",
             regroup_coordinator_start(&coordinator, engine, &options, &err));
  options.version = 3;
  EXPECT(REGROUP_OK, regroup_coordinator_start(&coordinator, engine, &options, &err));
  CHECK(coordinator != NULL);
  regroup_coordinator_free(coordinator);
  coordinator = NULL;
  options.version = REGROUP_COORDINATOR_OPTIONS_VERSION;
  options.tls_client_ca_file = NULL;

  CHECK_EQ_INT(regroup_coordinator_port(NULL), 0);
  EXPECT(REGROUP_INVALID_ARGUMENT, regroup_coordinator_publish(NULL, &err));
  CHECK_EQ_INT(regroup_coordinator_publish(NULL, NULL), REGROUP_INVALID_ARGUMENT);
  regroup_coordinator_free(NULL);
  regroup_engine_free(engine);
}

int main(void) {
  test_versions_and_statuses();
  test_validate();
  test_reading_jobs();
  test_engine_new();
  test_engine();
  test_coordinator();
  if (failures) {
    fprintf(stderr, "c_program: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("c_program: all %d checks passed (libregroup %s, ABI %u.%u)\n", checks,
         regroup_version_string(), (unsigned)(regroup_abi_version() >> 16),
         (unsigned)(regroup_abi_version() & 0xffffu));
  return 0;
}

