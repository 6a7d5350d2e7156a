/* SPDX-License-Identifier: Apache-2.0 */
/*
 * regroup.h: the C ABI of libregroup, Regroup's decision engine.
 *
 * The Volcano scheduler loads this library through cgo, so this header is plain C11 and is
 * the library's whole public surface. Compatibility: a program built against ABI major M works
 * with any library of the same major M and an equal or newer minor. Within a major version no
 * signature changes and no struct field moves; new behaviour gets a new function, and option
 * structs only grow at their end (their first field is `version`).
 *
 * Conventions (after libgit2, SQLite and wasmtime):
 *  - Every fallible function returns a regroup_status. Its last parameter, `err`, may be NULL;
 *    otherwise, on failure, *err receives an error object that the caller frees with
 *    regroup_error_free(). There is no per-thread "last error": cgo calls hop threads.
 *  - Results are written through out-parameters named `out`. A `char *` result is owned by the
 *    caller and freed with regroup_string_free(); it is NUL-terminated UTF-8 JSON unless stated.
 *  - Handles are opaque and created and destroyed in pairs (_new/_free); every _free accepts NULL.
 *  - Time is never read inside the library: every call that can decide takes `now_ms`, the
 *    caller's clock in milliseconds (any epoch, but one epoch per engine). Decisions are
 *    reproducible from their inputs.
 *  - All functions of one engine may be called from many threads at once; the read-only ones
 *    (decision, history, filter, score, export, snapshot) run in parallel with each other.
 *  - Nothing a caller passes can crash the library: malformed JSON, wrong types, huge values and
 *    NULL pointers give REGROUP_INVALID_ARGUMENT with a message naming what was wrong. No C++
 *    exception crosses this boundary.
 *
 * The JSON shapes (job specs, events, decisions, states) are documented in docs/abi.md, section
 * "The engine's JSON".
 */
#ifndef REGROUP_H
#define REGROUP_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define REGROUP_EXTERN __declspec(dllexport)
#elif defined(__GNUC__)
#define REGROUP_EXTERN __attribute__((visibility("default")))
#else
#define REGROUP_EXTERN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version. Since 1.0; minor 1 (the coordinator) since 1.1; minor 2 (reading a job's keys
 * and a Volcano Job) since 1.2; minor 3 (the coordinator's explicit insecure mode) since 1.3;
 * minor 4 (a Volcano Job's elastic_min_available) since 1.4; minor 5 (the managers' lease) since
 * 1.5; minor 6 (the coordinator's saved-state mark) since 1.6; minor 7 (job tokens) since 1.7;
 * minor 8 (the lease holder on record: regroup_coordinator_save_wanted; the coordinator's client
 * CA: mutual TLS with its managers) since 1.8. */
#define REGROUP_ABI_VERSION_MAJOR 1
#define REGROUP_ABI_VERSION_MINOR 8
/* (major << 16) | minor of this header; compare with regroup_abi_version(). */
#define REGROUP_ABI_VERSION ((REGROUP_ABI_VERSION_MAJOR << 16) | REGROUP_ABI_VERSION_MINOR)

/* The library's ABI version as (major << 16) | minor. A caller refuses a library whose major
 * differs from REGROUP_ABI_VERSION_MAJOR or whose minor is older than the one it was built with.
 * Since 1.0. */
REGROUP_EXTERN uint32_t regroup_abi_version(void);

/* The library's release, for example "0.1.0". Static storage: do not free. Since 1.0. */
REGROUP_EXTERN const char *regroup_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes: one table generates the enum, the names and the messages. Values never change.
 * ------------------------------------------------------------------------------------------- */
#define REGROUP_STATUS_TABLE(X)                                                                  \
  X(OK, 0, "success")                                                                            \
  X(INVALID_ARGUMENT, 1, "an argument is invalid: a NULL pointer, malformed JSON or a bad value") \
  X(NOT_FOUND, 2, "no job with that id is known to the engine")                                  \
  X(VALIDATION_FAILED, 3, "the job's configuration is invalid; the report names every problem")  \
  X(FAILED_PRECONDITION, 4, "the call does not fit the engine's current state")                  \
  X(VERSION_MISMATCH, 5, "an options struct or state document has an unsupported version")       \
  X(RESOURCE_EXHAUSTED, 6, "a size limit was reached: too many jobs or an input too large")      \
  X(INTERNAL, 7, "an internal error; please report it with the message")

#define REGROUP_STATUS_ENUM_ITEM_(name, value, message) REGROUP_##name = value,
/* Since 1.0. */
typedef enum regroup_status { REGROUP_STATUS_TABLE(REGROUP_STATUS_ENUM_ITEM_) } regroup_status;

/* "REGROUP_OK", "REGROUP_INVALID_ARGUMENT", ...; "REGROUP_UNKNOWN_STATUS" for any other value.
 * Static storage. Since 1.0. */
REGROUP_EXTERN const char *regroup_status_name(regroup_status status);
/* A one-line description of the status. Static storage. Since 1.0. */
REGROUP_EXTERN const char *regroup_status_message(regroup_status status);

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */
/* An error: a status and a message that says what happened, to what, and what to do. */
typedef struct regroup_error regroup_error;

/* The error's status; REGROUP_INVALID_ARGUMENT for a NULL error. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_error_status(const regroup_error *error);
/* The error's message, valid until regroup_error_free(); "" for a NULL error. Since 1.0. */
REGROUP_EXTERN const char *regroup_error_message(const regroup_error *error);
/* Frees an error; NULL is allowed. Since 1.0. */
REGROUP_EXTERN void regroup_error_free(regroup_error *error);

/* Frees a string returned by the library; NULL is allowed. Since 1.0. */
REGROUP_EXTERN void regroup_string_free(char *string);

/* The coordinator token of job `job_id` (NAMESPACE/NAME) whose Volcano Job has the uid `job_uid`,
 * derived from the cluster key (the coordinator's `credential`): what the job's manager presents
 * to the coordinator, as `regroupctl token` prints it. A scheduler plugin writes it into the job's
 * namespace when the job appears. *out receives 64 lowercase hex digits (free with
 * regroup_string_free). REGROUP_INVALID_ARGUMENT for a NULL argument, an empty key, a job id that
 * is not NAMESPACE/NAME or a uid that is not 1 to 128 printable ASCII characters (the message
 * says which). Thread-safe. Since 1.7. */
REGROUP_EXTERN regroup_status regroup_job_token(char **out, const char *cluster_key,
                                                const char *job_id, const char *job_uid,
                                                regroup_error **err);

/* ---------------------------------------------------------------------------------------------
 * Validation without an engine
 * ------------------------------------------------------------------------------------------- */
/* Validates a job spec (JSON, `len` bytes; need not be NUL-terminated). *out (optional, may be
 * NULL) receives the report: {"ok": bool, "problems": [{"severity": "warning"|"error", "key",
 * "value", "message"}], "config": {...resolved values...}}. Returns REGROUP_OK when the job has
 * no errors (it may have warnings), REGROUP_VALIDATION_FAILED when it has errors (the report is
 * still written), REGROUP_INVALID_ARGUMENT when the input is not a job spec at all. Thread-safe.
 * Since 1.0. */
REGROUP_EXTERN regroup_status regroup_validate_job(char **out, const char *job_json, size_t len,
                                                   regroup_error **err);

/* ---------------------------------------------------------------------------------------------
 * Reading a job: the rules a scheduler plugin shares with regroupctl and regroup-manager
 * ------------------------------------------------------------------------------------------- */
/* Whether a job's keys make it Regroup's: a MindCluster label or annotation of the
 * configuration table (`regroupctl keys`: a label such as fault-scheduling, an annotation such as
 * recover-strategy), or any label or annotation whose name starts with "regroup.io/". A job
 * without one is left to the scheduler's other plugins. Only the names count, not the values.
 * label_keys[0..label_count) and annotation_keys[0..annotation_count) are the names,
 * NUL-terminated; a list may be NULL when its count is 0. *out receives 1 or 0.
 * REGROUP_INVALID_ARGUMENT for a NULL out, a NULL list with a count, or a NULL name (the message
 * says which list and index). Thread-safe. Since 1.2. */
REGROUP_EXTERN regroup_status regroup_job_has_keys(uint8_t *out, const char *const *label_keys,
                                                   size_t label_count,
                                                   const char *const *annotation_keys,
                                                   size_t annotation_count, regroup_error **err);

/* Reads a Volcano Job (batch.volcano.sh/v1alpha1, kind Job; `len` bytes of YAML or JSON, at most
 * 4 MiB) into the engine's job spec, as `regroupctl validate` and `regroup-manager --job` read it.
 * Read: metadata.name, namespace (default "default"; the id is "namespace/name"), uid, labels and
 * annotations; spec.minAvailable and spec.policies; of each spec.tasks[i]: name, replicas
 * (default 1) and policies, and template.spec.containers[] command, args, env (name/value pairs)
 * and resources (limits, requests). A task named "manager", or with a container whose command or
 * args contain "regroup-manager", runs the job's manager: its replicas are manager pods, not
 * training pods. The first other task gives the processes per pod (an accelerator request
 * whose resource name holds "gpu", "npu" or "Ascend", else `--nproc-per-node` in the command,
 * else torchrun's PET_NPROC_PER_NODE in the container's env, else 1) and the env (its first
 * container's variables that the configuration table reads, MINDIO_WAIT_MINDX_TIME). *out receives
 *   {"job": <job spec>, "manager_tasks": [indexes into spec.tasks],
 *    "elastic_min_available": <pods>}
 * where elastic_min_available (since 1.4; present when the job's keys are valid) is the fewest
 * pods, the manager's included, the job runs on once scaled in as far as it may: the
 * spec.minAvailable a scheduler lowers a MindCluster-style every-pod minAvailable to once the job
 * runs; 0 for a job that never scales in.
 * A job with no training pods (none created yet, or only the manager's task) is read with
 * "pods": 0; regroup_engine_upsert_job refuses such a spec, so a caller waits for its pods.
 * REGROUP_INVALID_ARGUMENT with a message naming the field (and what it must be) when the
 * document is not a Volcano Job: not valid YAML or UTF-8, nested too deeply, another kind, a
 * field of the wrong type or out of range; REGROUP_RESOURCE_EXHAUSTED over 4 MiB. The spec is
 * read, not validated: upsert it, or call regroup_validate_job. Thread-safe. Since 1.2. */
REGROUP_EXTERN regroup_status regroup_volcano_job_read(char **out, const char *job, size_t len,
                                                       regroup_error **err);

/* ---------------------------------------------------------------------------------------------
 * The engine
 * ------------------------------------------------------------------------------------------- */
/* The decision engine: jobs, nodes, their faults and the decisions. Thread-safe. */
typedef struct regroup_engine regroup_engine;

#define REGROUP_ENGINE_OPTIONS_VERSION 1
/* Engine options. Zero means "the default" for every field but `version`. Since 1.0. */
typedef struct regroup_engine_options {
  uint32_t version;         /* REGROUP_ENGINE_OPTIONS_VERSION */
  uint32_t max_jobs;        /* jobs the engine accepts; default 100000 */
  uint32_t max_input_bytes; /* largest JSON document accepted; default 4 MiB (a snapshot:
                               64 times this) */
  uint32_t history_length;  /* decisions kept per job for the timeline; default 64 */
} regroup_engine_options;
#define REGROUP_ENGINE_OPTIONS_INIT {REGROUP_ENGINE_OPTIONS_VERSION, 0, 0, 0}

/* Creates an engine. `options` may be NULL for the defaults. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_new(regroup_engine **out,
                                                 const regroup_engine_options *options,
                                                 regroup_error **err);
/* Frees an engine; NULL is allowed. No other call on it may be running. Since 1.0. */
REGROUP_EXTERN void regroup_engine_free(regroup_engine *engine);

/* Adds a job or updates its spec (JSON). The spec is validated first: on errors the call
 * returns REGROUP_VALIDATION_FAILED and the engine keeps what it had (a job already accepted is
 * neither changed nor removed). *out (optional) receives the validation report, as
 * regroup_validate_job writes it. Updating a running job keeps its state (pods, phase, history)
 * and applies the new configuration from the next decision on. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_upsert_job(regroup_engine *engine, char **out,
                                                        const char *job_json, size_t len,
                                                        int64_t now_ms, regroup_error **err);

/* Removes a job and its state. REGROUP_NOT_FOUND if unknown. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_remove_job(regroup_engine *engine, const char *job_id,
                                                        regroup_error **err);

/* Applies one event or a JSON array of events. Kinds (field "type"): "node", "pod", "fault",
 * "replacement_registered", "manager_progress" ("manager_status", its former spelling, is accepted
 * as an alias and means the same). Events of an array are applied in order; on the first bad one
 * the call stops with its status, its message naming the event's index, and the events before it
 * stay applied: REGROUP_INVALID_ARGUMENT for a malformed event or one naming a
 * pod or rank the job does not have, REGROUP_NOT_FOUND for an unknown job,
 * REGROUP_FAILED_PRECONDITION for a replacement that cannot be one (a zombie: the lost pod's own
 * uid; or a pod that is not lost). Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_apply_events(regroup_engine *engine,
                                                          const char *events_json, size_t len,
                                                          int64_t now_ms, regroup_error **err);

/* Node health, for the typed fast path. Since 1.0. */
typedef enum regroup_node_health {
  REGROUP_NODE_HEALTHY = 0,
  REGROUP_NODE_FAULTY = 1,
  REGROUP_NODE_UNKNOWN = 2
} regroup_node_health;

/* Sets one node's health (typed fast path for the per-node loop of a scheduling session).
 * `reason` may be NULL. Setting the health a node already has is cheap and changes nothing.
 * Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_set_node_health(regroup_engine *engine,
                                                             const char *node,
                                                             regroup_node_health health,
                                                             const char *reason, int64_t now_ms,
                                                             regroup_error **err);

/* Pod phases, for the typed fast path. Since 1.0. */
typedef enum regroup_pod_phase {
  REGROUP_POD_PENDING = 0,
  REGROUP_POD_BOUND = 1,
  REGROUP_POD_RUNNING = 2,
  REGROUP_POD_FAILED = 3,
  REGROUP_POD_DELETED = 4
} regroup_pod_phase;

/* Reports one pod of a job: its index in the job (node rank), uid, phase and node (NULL or ""
 * when not bound). A uid the engine has not seen for that index is a replacement pod. Setting
 * the state a pod already has is cheap and changes nothing. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_set_pod_state(regroup_engine *engine,
                                                           const char *job_id, uint32_t pod_index,
                                                           const char *pod_uid,
                                                           regroup_pod_phase phase,
                                                           const char *node, int64_t now_ms,
                                                           regroup_error **err);

/* Advances every job to `now_ms`: closes report windows, decides, expires deadlines, starts
 * scale-outs. *changed_out (optional) receives how many jobs got a new directive. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_tick(regroup_engine *engine, int64_t now_ms,
                                                  uint32_t *changed_out, regroup_error **err);

/* A job's phase. Since 1.0. */
typedef enum regroup_phase {
  REGROUP_PHASE_RUNNING = 0,     /* training at full size */
  REGROUP_PHASE_RECOVERING = 1,  /* retry or in-place restart in progress */
  REGROUP_PHASE_WAITING = 2,     /* waiting for replacements until deadline_ms */
  REGROUP_PHASE_SCALED_IN = 3,   /* training on fewer replicas (dp) */
  REGROUP_PHASE_SCALING_OUT = 4, /* a larger generation is being formed */
  REGROUP_PHASE_PAUSED = 5,      /* process-recover-enable=pause: faults held */
  REGROUP_PHASE_DUMPING = 6,     /* survivors write a checkpoint, then exit */
  REGROUP_PHASE_EXITING = 7,     /* the job stops with a reason */
  REGROUP_PHASE_RESTARTING = 8,  /* being rescheduled: every pod, or the faulty ones */
  REGROUP_PHASE_FAILED = 9       /* the job's configuration was refused */
} regroup_phase;

/* The directive for the job's manager. Since 1.0. */
typedef enum regroup_directive_kind {
  REGROUP_DIRECTIVE_CONTINUE = 0,         /* nothing to do */
  REGROUP_DIRECTIVE_RETRY = 1,            /* abort the step everywhere and do it again */
  REGROUP_DIRECTIVE_RESTART_IN_PLACE = 2, /* restart these ranks' processes on their pods */
  REGROUP_DIRECTIVE_WAIT = 3,             /* survivors wait for replacements until deadline_ms */
  REGROUP_DIRECTIVE_RESUME = 4,           /* replacements arrived: form the generation at dp */
  REGROUP_DIRECTIVE_SCALE_IN = 5,         /* continue at dp without the removed replicas */
  REGROUP_DIRECTIVE_SCALE_OUT = 6,        /* grow to dp at the next step boundary */
  REGROUP_DIRECTIVE_DUMP = 7,             /* survivors checkpoint and exit */
  REGROUP_DIRECTIVE_EXIT = 8,             /* stop the job */
  REGROUP_DIRECTIVE_RESTART_JOB = 9       /* reschedule: every process restarts from a checkpoint */
} regroup_directive_kind;

#define REGROUP_DECISION_VERSION 1
/* A job's current decision, typed. The caller sets `version`; the library fills what that
 * version has. The full decision, with replica lists and the reason, is regroup_engine_decision
 * _json(). Since 1.0. */
typedef struct regroup_decision {
  uint32_t version;               /* REGROUP_DECISION_VERSION */
  regroup_phase phase;            /* the job's phase */
  regroup_directive_kind kind;    /* the current directive */
  uint64_t directive_id;          /* grows by one with every new directive of this job */
  int64_t deadline_ms;            /* WAIT: until when; otherwise -1 */
  uint32_t dp;                    /* data-parallel degree of the directive (current if none) */
  uint32_t original_dp;           /* the job's full data-parallel degree */
  uint32_t gang_min;              /* the job's gang minimum (pods) now */
  uint32_t wants_pods;            /* 1 when the job wants replacement pods scheduled */
  uint32_t evictions;             /* pods the scheduler should evict now */
} regroup_decision;
#define REGROUP_DECISION_INIT {REGROUP_DECISION_VERSION, REGROUP_PHASE_RUNNING, \
  REGROUP_DIRECTIVE_CONTINUE, 0, -1, 0, 0, 0, 0, 0}

/* Writes a job's decision into *out (typed). Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_decision(regroup_engine *engine, regroup_decision *out,
                                                      const char *job_id, regroup_error **err);

/* A job's decision as JSON: phase, directive (kind, id, dp, keep/remove replicas, standby pods,
 * restart ranks, micro-batches per replica, deadline, reason), and the scheduler's part
 * (evictions with their mode, nodes to avoid, gang minimum, wants pods). Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_decision_json(regroup_engine *engine, char **out,
                                                           const char *job_id, regroup_error **err);

/* A job's timeline: the decisions taken so far (the last history_length), oldest first, each
 * with its time, phase, directive and reason. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_history_json(regroup_engine *engine, char **out,
                                                          const char *job_id, regroup_error **err);

/* Predicate fast path: out[i] = 1 when the job's pods may run on nodes[i], 0 when the node's
 * health is faulty or unknown, or this job avoids it. A node the engine has never been told
 * about counts as allowed (the scheduler knows it better). A NULL name gives 0. Read-only: calls
 * on one engine may run in parallel with each other. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_filter_nodes(regroup_engine *engine, uint8_t *out,
                                                          const char *job_id,
                                                          const char *const *nodes, size_t count,
                                                          regroup_error **err);

/* Node-order fast path: out[i] = a score from 0 to 100 for placing the job's pod `pod_index` on
 * nodes[i]: 100 for the pod's previous node, 50 for a node that hosts a pod of the same replica,
 * 0 otherwise (and for nodes the job must avoid). Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_score_nodes(regroup_engine *engine, int32_t *out,
                                                         const char *job_id, uint32_t pod_index,
                                                         const char *const *nodes, size_t count,
                                                         regroup_error **err);

/* A job's compact state, to store in its PodGroup's annotations (JSON). Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_export_job_state(regroup_engine *engine, char **out,
                                                              const char *job_id,
                                                              regroup_error **err);
/* Restores a job's state exported by regroup_engine_export_job_state(), for example after a
 * scheduler restart. The job must have been upserted first; deadlines keep their times. A state
 * of another job (id or uid differ) is refused with REGROUP_FAILED_PRECONDITION. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_import_job_state(regroup_engine *engine,
                                                              const char *job_id,
                                                              const char *state_json, size_t len,
                                                              regroup_error **err);

/* The whole engine (jobs with their specs and states, nodes) as JSON. Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_snapshot(regroup_engine *engine, char **out,
                                                      regroup_error **err);
/* Replaces the engine's whole content by a snapshot. On any error the engine is unchanged.
 * Since 1.0. */
REGROUP_EXTERN regroup_status regroup_engine_restore(regroup_engine *engine,
                                                     const char *snapshot_json, size_t len,
                                                     regroup_error **err);

/* ---------------------------------------------------------------------------------------------
 * The coordinator
 * ------------------------------------------------------------------------------------------- */
/* The coordinator: a gRPC server inside the library (service regroup.v1.Coordinator of
 * proto/regroup/v1/wire.proto) that connects the jobs' managers to an engine. Each manager
 * keeps one stream (Attach). Its first message is `hello`, with the job's id in the header; a job
 * the engine does not know is refused (NOT_FOUND). With a credential (the cluster key), a stream
 * must carry the token of the job it names, HMAC-SHA256 of the job's id and uid under the key
 * (`regroupctl token`; docs/security.md): none is refused UNAUTHENTICATED, another job's token or
 * the key itself PERMISSION_DENIED. Epochs are granted by the coordinator: a hello with epoch 0 is
 * granted one above any the job had (above those granted before, the one the job's saved state
 * holds, and the wall clock in ms), with a ticket; a manager reattaches with its epoch and ticket,
 * and an epoch without a valid ticket is refused PERMISSION_DENIED. Only the highest epoch of a
 * job is served: an older manager is refused as fenced (FAILED_PRECONDITION), and a newer one
 * (or the same epoch on a new stream, a reconnect) replaces the attached stream, which is closed.
 *
 * An attached manager's facts become the engine's events: `fault` a "fault" event (the engine's
 * kind names; a checksum mismatch counts as a collective error), `replacement` the pod running
 * with its new uid and "replacement_registered", `progress` "manager_progress". A bad fact (a pod
 * out of range, a zombie's uid) is answered with a Refusal carrying the engine's error and changes
 * nothing. The manager receives its job's current directive when it attaches and, through
 * regroup_coordinator_publish, whenever the directive's id changes.
 *
 * Clock: facts are applied at the wall clock, in milliseconds since the Unix epoch, so an engine
 * served by a coordinator must be driven on that clock (`now_ms` of every call).
 * All functions of one coordinator are thread-safe, except regroup_coordinator_free. Since 1.1. */
typedef struct regroup_coordinator regroup_coordinator;

#define REGROUP_COORDINATOR_OPTIONS_VERSION 4
/* Coordinator options. NULL or "" means "the default" for every string. The strings are copied:
 * they need to live only during regroup_coordinator_start. Since 1.1; version 2 (`insecure`)
 * since 1.3; version 3 (`lease_ms`) since 1.5; version 4 (`tls_client_ca_file`) since 1.8. */
typedef struct regroup_coordinator_options {
  uint32_t version;          /* REGROUP_COORDINATOR_OPTIONS_VERSION */
  const char *listen;        /* "HOST:PORT" to listen on; default "0.0.0.0:8899"; port 0: any free
                                port (read it with regroup_coordinator_port) */
  const char *credential;    /* the cluster key: each manager sends its job's token, derived from
                                it ("authorization: Bearer <token>"). Required since 1.3 unless
                                `insecure` is set: a coordinator without one would accept every
                                client as any job's manager */
  const char *tls_cert_file; /* serve TLS with this certificate (PEM) and tls_key_file; default
                                plaintext. Give both or neither. */
  const char *tls_key_file;  /* the certificate's private key (PEM) */
  uint32_t insecure;         /* non-zero: serve without a credential, accepting only managers
                                that send none (tests on a trusted network); the caller says so
                                in its log at every start. Version 2. */
  int64_t lease_ms;          /* the managers' lease: a manager commits a step only within this
                                long of asking the coordinator (a cut-off manager stops
                                committing), and a newer manager of a job gets no lease before
                                the older one's ran out, nor before this long after a start;
                                0: 10000; at most 600000. Version 3. */
  const char *tls_client_ca_file; /* mutual TLS: every manager must present a certificate this
                                CA bundle (PEM) signed, or its handshake fails; needs
                                tls_cert_file and tls_key_file. Default: no client certificate
                                asked. Version 4. */
} regroup_coordinator_options;
#define REGROUP_COORDINATOR_OPTIONS_INIT \
  {REGROUP_COORDINATOR_OPTIONS_VERSION, NULL, NULL, NULL, NULL, 0, 0, NULL}

/* Starts a coordinator serving `engine`, which must outlive it (free the coordinator first).
 * `options` may be NULL for the defaults. On success *out receives the handle, freed with
 * regroup_coordinator_free(); on failure *out is NULL: REGROUP_INVALID_ARGUMENT for a NULL
 * argument, an address it cannot listen on, a TLS file that cannot be read (one of the two
 * missing), a client CA without the server's own certificate and key, or no credential without
 * `insecure` (NULL options and version 1 options included:
 * they cannot ask for insecure mode); REGROUP_VERSION_MISMATCH for an options version this
 * library does not know.
 * Since 1.1. */
REGROUP_EXTERN regroup_status regroup_coordinator_start(regroup_coordinator **out,
                                                        regroup_engine *engine,
                                                        const regroup_coordinator_options *options,
                                                        regroup_error **err);

/* The port the coordinator listens on (the one chosen when `listen` asked for port 0); 0 for a
 * NULL coordinator. Since 1.1. */
REGROUP_EXTERN int32_t regroup_coordinator_port(const regroup_coordinator *coordinator);

/* Sends every attached manager its job's current directive when the directive's id changed since
 * it was last sent; a manager whose job the engine no longer has is told so and its stream ends.
 * Call it after regroup_engine_tick (and after any call that can issue a directive). Takes the
 * engine's lock as a reader. REGROUP_INVALID_ARGUMENT for a NULL coordinator. Since 1.1. */
REGROUP_EXTERN regroup_status regroup_coordinator_publish(regroup_coordinator *coordinator,
                                                          regroup_error **err);

/* A job's state, as regroup_engine_export_job_state gives it, and the mark of its manager's facts
 * it holds (*fact_epoch, *fact_seq), read together. Store the state where a restarted scheduler
 * imports it from, then call regroup_coordinator_state_saved with the mark: from the first such
 * call on, the coordinator acknowledges to a manager only the facts a stored state holds, and the
 * manager sends the others again to a restarted coordinator, whose engine came back without
 * them. Takes the engine's lock as a reader. REGROUP_INVALID_ARGUMENT for a NULL argument,
 * REGROUP_NOT_FOUND for a job the engine does not have. Since 1.6. */
REGROUP_EXTERN regroup_status regroup_coordinator_export_job_state(regroup_coordinator *coordinator,
                                                                   const char *job_id, char **out,
                                                                   uint64_t *fact_epoch,
                                                                   uint64_t *fact_seq,
                                                                   regroup_error **err);
/* The state exported with the mark (fact_epoch, fact_seq) is stored: its facts are acknowledged,
 * and the lease holder it names is on record (since 1.8). It confirms the job's latest export
 * with that mark: export, store, then this call, one job at a time. A mark of an epoch the job's
 * manager no longer has acknowledges nothing. REGROUP_INVALID_ARGUMENT for a NULL argument.
 * Since 1.6. */
REGROUP_EXTERN regroup_status regroup_coordinator_state_saved(regroup_coordinator *coordinator,
                                                              const char *job_id,
                                                              uint64_t fact_epoch,
                                                              uint64_t fact_seq,
                                                              regroup_error **err);

/* Whether the job's state names a lease holder that no stored state names yet: a new manager's
 * first lease waits for it (after a restart the stored holder is granted its lease at once, and
 * every other manager waits a lease). When it returns 1, export the state, store it and call
 * regroup_coordinator_state_saved at the next session, even if nothing else changed. 0 for a
 * NULL argument, an unknown job, or before the first regroup_coordinator_state_saved. Takes the
 * engine's lock as a reader. Since 1.8. */
REGROUP_EXTERN int regroup_coordinator_save_wanted(regroup_coordinator *coordinator,
                                                   const char *job_id);

/* Stops the coordinator: refuses new streams, ends every stream (managers see UNAVAILABLE and
 * reconnect to the next coordinator) and frees it. Returns within about a second. NULL is
 * allowed. No other call on it may be running. Since 1.1. */
REGROUP_EXTERN void regroup_coordinator_free(regroup_coordinator *coordinator);

#ifdef __cplusplus
}
#endif

#endif /* REGROUP_H */
