/* dynamo_ctx.h: the C ABI of the dynamo-ctx native library
   (_native.abi3.so, which is also the CPython extension module
   dynamo_ctx._native). This file is the reference; docs/c-abi.md is the
   overview with examples.

   Conventions, for every function below unless its comment says otherwise:
   - It returns 0 (DC_OK) or an error code (DC_E*); dc_last_error then gives
     a message, per calling thread. No function writes to stdout or stderr
     (log records go to the log queue, see dc_log_fd), and none lets a crash
     through: a bug is DC_EINTERNAL and the library stays usable.
   - Objects are named by 64-bit handles: never 0, never reused in practice,
     tagged with their kind, so a stale, freed, forged or wrong-kind handle is
     DC_EBADF rather than a crash. Free each with its dc_*_free.
   - Strings passed in are (pointer, length) pairs of UTF-8 with no NUL.
     Strings passed out are copied into the caller's (buf, cap) with a
     terminating NUL, their length without the NUL stored in *len; if cap is
     too small the result is DC_ERANGE with *len still set: call again with a
     larger buffer ("as dc_context_id does").
   - Nothing blocks unless its comment says so (dc_runtime_new,
     dc_client_new). Progress is signalled by pushing a caller-chosen token
     onto an event queue, whose fd is readable while tokens wait
     (dc_context_watch, dc_arm); the caller's event loop drains it.
   - Every function may be called from any thread. Go never calls the host. */
#ifndef DYNAMO_CTX_H
#define DYNAMO_CTX_H

#include <stddef.h>
#include <stdint.h>

/* Error codes returned by every dc_* function (0 is success). The values
   follow errno where one fits, so strerror gives a rough idea, but
   dc_last_error gives the precise message. */
enum {
    DC_OK = 0,
    DC_ENOENT = 2,           /* no such entry (dc_queue_unwatch: token not pending) */
    DC_EIO = 5,              /* the operating system refused (pipe creation, listening, ...) */
    DC_EBADF = 9,            /* zero, stale, freed, forged or wrong-kind handle */
    DC_EAGAIN = 11,          /* nothing now: arm the object and retry when its token arrives */
    DC_EEXIST = 17,          /* token already pending on this queue */
    DC_EINVAL = 22,          /* invalid argument: NULL pointer, bad UTF-8, bad id, path, state, reason, route, JSON */
    DC_ERANGE = 34,          /* the caller's buffer is too small; the needed size was stored */
    DC_EINTERNAL = 1000,     /* a bug: a Go panic was recovered; the library is still usable */
    DC_EOF = 1001,           /* the response stream ended normally: no more items */
    DC_EHANDLER = 1002,      /* the remote handler raised; the message says what */
    DC_EINCOMPLETE = 1003,   /* "Stream ended before generation completed" */
    DC_ENORESPONDERS = 1004, /* no worker received the request */
    DC_ECLOSED = 1005,       /* the runtime (or endpoint, client) is shut down */
    DC_ECONNECT = 1006       /* could not connect to NATS or set up the runtime */
};

/* The size of a buffer that holds any message dc_last_error gives: a message
   is at most DC_ERROR_MESSAGE_MAX - 1 bytes (the library truncates a longer
   one), plus the NUL. */
enum { DC_ERROR_MESSAGE_MAX = 1024 };

/* Context states, in bits 0-7 of a state word. A state only moves forward:
   live -> stopped -> killed. */
enum { DC_LIVE = 0, DC_STOPPED = 1, DC_KILLED = 2 };

/* The state word's layout: the state in bits 0-7 (word & DC_STATE_MASK), the
   reason in bits 8-15 ((word >> DC_REASON_SHIFT) & DC_FIELD_MASK), the cause
   in bits 16-23 ((word >> DC_CAUSE_SHIFT) & DC_FIELD_MASK), zero above. */
enum { DC_STATE_MASK = 0xff, DC_REASON_SHIFT = 8, DC_CAUSE_SHIFT = 16, DC_FIELD_MASK = 0xff };

/* Cancellation reasons, in bits 8-15 of a state word (and the cause, the
   reason where the cancellation started, in bits 16-23). dc_reason_name
   gives each one's name. DC_REASON_COUNT is the number of codes,
   DC_REASON_NONE included: every reason is below it. */
enum {
    DC_REASON_NONE = 0,
    DC_REASON_STOP_GENERATING = 1,
    DC_REASON_KILL = 2,
    DC_REASON_CLIENT_DISCONNECTED = 3,
    DC_REASON_PARENT = 4,
    DC_REASON_DEADLINE = 5,
    DC_REASON_CONNECTION_LOST = 6,
    DC_REASON_SHUTDOWN = 7,
    DC_REASON_COUNT = 8
};

/* How dc_client_generate picks a worker instance. */
enum { DC_ROUTE_ROUND_ROBIN = 0, DC_ROUTE_RANDOM = 1, DC_ROUTE_DIRECT = 2 };

/* The longest id, in bytes of UTF-8. The id rule (one for contexts and the
   requests they travel with): 1 to DC_MAX_ID_LEN bytes of UTF-8, every
   character printable (no control, format or other space characters than
   the ASCII space; so no NUL). dc_id_check applies it. */
enum { DC_MAX_ID_LEN = 256 };

/* A timeout (dc_context_set_timeout) must be below this many seconds (a year). */
enum { DC_MAX_TIMEOUT_SECONDS = 31536000 };

/* How often a host that watches itself calls dc_runtime_host_tick, in
   milliseconds. */
enum { DC_HOST_TICK_MS = 100 };

/* Bounds of one call: the items of dc_request_send_many, and of each request
   of dc_request_send_multi; the requests of dc_request_send_multi, and their
   items in all. */
enum { DC_SEND_MANY_MAX = 65536, DC_SEND_MULTI_MAX_REQUESTS = 65536, DC_SEND_MULTI_MAX_ITEMS = 16777216 };

/* The largest message the library reads from its post socket (dc_post_fd). */
enum { DC_POST_MAX_MESSAGE = 262144 };

/* The size of a buffer that holds any path of a status listener
   (dc_status_next): a path is at most DC_STATUS_PATH_MAX - 1 bytes, plus the
   NUL. */
enum { DC_STATUS_PATH_MAX = 64 };
/* A worker's model card (dc_model_card) and its model directory's files
   (go/hfmodel): a card's JSON is at most DC_MODEL_CARD_MAX_BYTES;
   tokenizer.json is read up to DC_MODEL_MAX_TOKENIZER_BYTES, the other files
   of the directory (tokenizer_config.json, the chat template files,
   config.json) up to DC_MODEL_MAX_CONFIG_BYTES. */
enum { DC_MODEL_CARD_MAX_BYTES = 16384, DC_MODEL_MAX_TOKENIZER_BYTES = 268435456, DC_MODEL_MAX_CONFIG_BYTES = 16777216 };

/* The library's own cgo preambles include this file for the enums only:
   cgo declares the functions itself, with char* where const char* is meant. */
#ifndef DC_ENUMS_ONLY

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------
   Library
   ------------------------------------------------------------------ */

/* Returns the library's version, a static NUL-terminated string. */
const char *dc_version(void);

/* Copies the library's string constant called name into buf, as
   dc_context_id does: "handler_error_prefix" (what starts the message of a
   remote handler's failure), "nats_env" (the environment variable naming
   the NATS address), "nats_default_url" (the address used without one),
   "kill_trace_env" (the environment variable that makes the library
   append each kill's hops to a file, for benchmarks), "base_params" and
   "engine_params" (the sampling parameters of a token request, and those an
   engine may honour, comma-separated), "tool_call_parsers" and
   "reasoning_parsers" (the parser names a model card may give,
   comma-separated).
   Errors: DC_EINVAL for a NULL name, DC_ENOENT for an unknown name,
   DC_ERANGE. */
int dc_string_constant(const char *name, char *buf, size_t cap, size_t *len);

/* Copies the calling thread's last error message into buf (NUL-terminated,
   truncated to cap-1 bytes) and returns its full length, which is below
   DC_ERROR_MESSAGE_MAX. buf may be NULL to ask for the length. Messages are
   per thread and only set by failing calls. */
size_t dc_last_error(char *buf, size_t cap);


/* Builds the model card a worker publishes with its instance (its instance
   metadata: docs/design.md, "The model card") and copies its JSON into buf,
   as dc_context_id does (DC_MODEL_CARD_MAX_BYTES + 1 bytes always suffice).
   model is the name clients use, mode "agg", "prefill" or "decode";
   migration_limit, max_num_seqs (the capacity) and max_model_len (the
   context length) are 0 or more, 0 for the last two meaning not declared;
   model_path is the model directory's absolute path (NULL or path_len 0:
   none); supports names the engine parameters the engine honours,
   comma-separated (NULL or supports_len 0: none; the names are
   dc_string_constant's "engine_params"); tool_call_parser and
   reasoning_parser name the parsers the frontend reads the model's output
   with (NULL or length 0: none; the names are dc_string_constant's
   "tool_call_parsers" and "reasoning_parsers"). With a model directory, this call reads its text files (each within
   the bounds above) for the card's text checksum: it blocks for that read.
   Errors: DC_EINVAL for a NULL model or mode, or a card that breaks a rule
   (the message says which); DC_EIO for a model directory whose text files
   cannot be read; DC_ERANGE. */
int dc_model_card(const char *model, size_t model_len, const char *mode, size_t mode_len, int64_t migration_limit,
                  int64_t max_num_seqs, int64_t max_model_len, const char *model_path, size_t path_len,
                  const char *supports, size_t supports_len, const char *tool_call_parser, size_t tool_call_parser_len,
                  const char *reasoning_parser, size_t reasoning_parser_len, char *buf, size_t cap, size_t *len);


/* ------------------------------------------------------------------
   Contexts
   ------------------------------------------------------------------ */

/* Checks an id (len bytes at id) by the id rule (see DC_MAX_ID_LEN), the one
   dc_context_new applies: for a host that creates a context's Go side later.
   Errors: DC_EINVAL, with a message saying what is wrong and the rule. */
int dc_id_check(const char *id, size_t len);

/* Creates a live root context with the given id (len bytes, by the id rule:
   see DC_MAX_ID_LEN) and stores its handle in *out. Errors: DC_EINVAL for a
   NULL id or out, or an id that breaks the rule. */
int dc_context_new(const char *id, size_t len, uint64_t *out);

/* Creates a live root context with a fresh random UUID as its id.
   Errors: DC_EINVAL for a NULL out. */
int dc_context_new_uuid(uint64_t *out);

/* Releases a context handle. The context itself lives on while a parent,
   child or request still needs it (it keeps propagating cancellation); its
   state word pointer (dc_context_state_word) must not be used after this.
   Errors: DC_EBADF (including a second free of the same handle). */
int dc_context_free(uint64_t h);

/* Copies the context's id into buf (NUL-terminated) and its length without
   the NUL into *len. Errors: DC_EBADF; DC_ERANGE if cap < length+1 (*len is
   still set, so call again with a larger buffer). */
int dc_context_id(uint64_t h, char *buf, size_t cap, size_t *len);

/* Stores the context's state word in *word: state (DC_LIVE, DC_STOPPED,
   DC_KILLED) in bits 0-7, reason (DC_REASON_*) in bits 8-15, and the cause
   (the reason where the cancellation started; differs from the reason for a
   context cancelled through its parent) in bits 16-23.
   Errors: DC_EBADF, DC_EINVAL for a NULL word. */
int dc_context_state(uint64_t h, uint32_t *word);

/* Stores in *out a pointer to the context's state word, which the library
   updates with atomic stores and which stays valid until dc_context_free of
   this handle. Read it with an atomic (acquire) load: this is how a caller
   polls a context without calling into the library at all.
   Errors: DC_EBADF, DC_EINVAL for a NULL out. */
int dc_context_state_word(uint64_t h, const uint32_t **out);

/* Moves the context to state (DC_STOPPED or DC_KILLED) with the given reason
   (DC_REASON_STOP_GENERATING .. DC_REASON_SHUTDOWN), and its linked children
   with DC_REASON_PARENT, before returning. A context already at or past state
   is unchanged (success). Errors: DC_EBADF, DC_EINVAL for another state or
   reason. */
int dc_context_cancel(uint64_t h, uint32_t state, uint32_t reason);

/* dc_context_cancel for a host whose event loop the cancel wakes: the state
   words and what the host waits on (dc_context_watch; but for its
   hand-off) change before this returns, as with dc_context_cancel; the
   wake-ups of the library's own threads that the cancellation causes (the
   Kill frame to a handler in this process, which was itself cancelled at
   once; the request's writer) are held. *ticket is set to the ticket of
   what was held, or 0 when nothing was. The host runs them with
   dc_run_held(ticket) once its loop has run what the cancel woke (its next
   turn), so an in-process handler's wake-up does not wait for them. The calls that wait (docs/c-abi.md, "Blocking")
   run every held wake-up first; no other call waits for one.
   Errors: those of dc_context_cancel; DC_EINVAL for a NULL ticket. */
int dc_context_cancel_held(uint64_t h, uint32_t state, uint32_t reason, uint64_t *ticket);

/* dc_context_cancel_held for a host whose event loop reads the event queue
   q (see dc_queue_new) on the calling thread: the tokens the cancel pushes
   to q (the watches it fires there: an in-process handler's, a waiter's;
   not those handed off, dc_context_watch) are not written to q's fd but
   stored in toks, at most capacity of them, and *ntoks is set to how
   many; the host delivers them itself, at once, without reading the fd.
   Tokens past capacity, and any token that another thread pushes to q
   during the call, reach q as usual or are in toks.
   Tokens in toks are not ordered with those already in the fd.
   Errors: those of dc_context_cancel_held (nothing is cancelled, *ntoks is
   0); DC_EBADF for q; DC_EINVAL for a NULL ntoks, or a NULL toks with a
   capacity. */
int dc_context_cancel_local(uint64_t h, uint32_t state, uint32_t reason, uint64_t q, uint64_t *toks, size_t capacity,
                            size_t *ntoks, uint64_t *ticket);

/* Runs, oldest first, the wake-ups dc_context_cancel_held held with a
   ticket of at most upto (UINT64_MAX: all), and stores in *ran (if not
   NULL) how many cancels' wake-ups it ran. Never fails. */
int dc_run_held(uint64_t upto, size_t *ran);

/* Stores in *out the state word a context whose word is word would have
   after dc_context_cancel(h, state, reason): the library's one transition
   rule (forward only; the reason, and the cause, which for a direct cancel
   is the reason, change only with the state), for a host that keeps a
   context's word itself until it creates the context (see dc_context_new);
   *out is word when the cancel changes nothing. Touches no context.
   Errors: DC_EINVAL for a NULL out, or the state or reason
   dc_context_cancel refuses. */
int dc_state_word_next(uint32_t word, uint32_t state, uint32_t reason, uint32_t *out);

/* dc_context_cancel(h, DC_STOPPED, DC_REASON_STOP_GENERATING). Idempotent. */
int dc_context_stop_generating(uint64_t h);

/* dc_context_cancel(h, DC_KILLED, DC_REASON_KILL). Idempotent. */
int dc_context_kill(uint64_t h);

/* Links child below parent: stopping or killing parent does the same to child.
   If parent is already stopped or killed, child is moved to that state before
   this returns. Cycles are allowed. Errors: DC_EBADF for either handle. */
int dc_context_link_child(uint64_t parent, uint64_t child);

/* Creates a new context with parent's id, already linked below parent, and
   stores its handle in *out. Errors: DC_EBADF, DC_EINVAL for a NULL out. */
int dc_context_child(uint64_t parent, uint64_t *out);

/* Declares the context's request finished: it is unlinked from its parents,
   which stop holding it. Its state and its own children are unaffected; its
   deadline's timer stops (its children keep theirs).
   Errors: DC_EBADF. */
int dc_context_finish(uint64_t h);

/* Gives the context a deadline seconds from now: then it is killed with
   DC_REASON_DEADLINE, as dc_context_cancel kills, by a timer the library
   holds (nothing to poll). A deadline only moves earlier: one later than the
   context's is ignored (success). Its linked children keep the earlier of
   theirs and this one; a child linked later takes it too. 0 kills at once.
   A killed or finished context is unchanged (success). Errors: DC_EBADF;
   DC_EINVAL for seconds that is not a number, negative, or not below
   DC_MAX_TIMEOUT_SECONDS. */
int dc_context_set_timeout(uint64_t h, double seconds);

/* Checks a timeout in seconds as every function that takes one does
   (dc_context_set_timeout, dc_frontend_drain, the frontend's settings and
   header): for a host that checks one before it is used. Errors: DC_EINVAL
   for seconds that is not a number, negative, or not below
   DC_MAX_TIMEOUT_SECONDS, with a message saying which. */
int dc_timeout_check(double seconds);

/* Stores in *seconds the time left until the context's deadline, 0 once it
   has passed, or -1 when the context has none.
   Errors: DC_EBADF, DC_EINVAL for a NULL seconds. */
int dc_context_remaining(uint64_t h, double *seconds);

/* Copies the name of a reason ("stop_generating", "kill", ...) into buf, as
   dc_context_id does. Errors: DC_EINVAL for an unknown reason or
   DC_REASON_NONE, DC_ERANGE. */
int dc_reason_name(uint32_t reason, char *buf, size_t cap, size_t *len);


/* ------------------------------------------------------------------
   Event queues
   ------------------------------------------------------------------ */

/* Creates an event queue: a FIFO of 64-bit tokens and a file descriptor, the
   read end of a non-blocking pipe, that carries them: each token is written
   to it as 8 bytes in native byte order, so it is readable whenever tokens
   wait (watch it with poll, epoll, or an event loop's add_reader). Take the
   tokens with dc_queue_drain, or read them from the fd yourself, in reads of
   a multiple of 8 bytes, without calling the library: a token that finds the
   pipe full waits in the library, with every later one, until
   dc_queue_drain; so a reader that read more than dc_queue_drain_after's
   bytes since it last found the pipe empty must then call dc_queue_drain too
   (oldest first: the pipe's tokens are older). Stores the handle in *out and
   the fd in *fd; the fd belongs to the queue and is closed by dc_queue_free.
   Errors: DC_EINVAL for NULL pointers, DC_EIO. */
int dc_queue_new(uint64_t *out, int *fd);

/* Stores in *bytes the rule of dc_queue_new for a reader of the fd: past this
   many bytes read since the pipe was last found empty, call dc_queue_drain
   (0: after any read). It does not change. Errors: DC_EBADF, DC_EINVAL. */
int dc_queue_drain_after(uint64_t q, size_t *bytes);

/* Frees an event queue: unregisters its pending watches and closes its fd
   (remove the fd from your event loop first). Errors: DC_EBADF. */
int dc_queue_free(uint64_t q);

/* Moves up to cap tokens, oldest first (from the fd's pipe, then those that
   wait in the library), into buf and stores their number in *n. When the
   queue becomes empty its fd stops being readable; if tokens remain (*n ==
   cap) call again. Errors: DC_EBADF, DC_EINVAL for NULL pointers. */
int dc_queue_drain(uint64_t q, uint64_t *buf, size_t cap, size_t *n);

/* Arranges for token to be pushed onto queue q once, when the context reaches
   state (DC_STOPPED, which a kill also satisfies, or DC_KILLED). If it already
   has, the token is pushed at once. One exception, the hand-off: while the
   library aborts a request of the context in the engine itself (an armed
   route, dynamo_ctx_services.h), a watch that a kill fires pushes its
   token no sooner than 5 ms after the library's abort left (at once if
   that has passed), so that the host's work on the kill leaves the CPUs to
   the engine reading the abort (docs/design.md, "Aborts from the
   library"). Errors: DC_EBADF for either handle, DC_EINVAL for another
   state, DC_EEXIST if token is already pending on q. */
int dc_context_watch(uint64_t h, uint64_t q, uint32_t state, uint64_t token);

/* Pushes n tokens onto queue q, in order, as fired watches would: for a
   host that took tokens from dc_context_cancel_local and cannot deliver them
   itself. Errors: DC_EBADF, DC_EINVAL for a NULL toks with n > 0. */
int dc_queue_push(uint64_t q, const uint64_t *toks, size_t n);

/* Cancels a pending watch. Errors: DC_EBADF, DC_ENOENT if token is not pending
   (never registered, or already fired: then it is in, or was drained from, the
   queue). */
int dc_queue_unwatch(uint64_t q, uint64_t token);


/* ------------------------------------------------------------------
   Diagnostics
   ------------------------------------------------------------------ */

/* Stores the numbers of live context handles, queue handles and all other
   handles (runtimes, endpoints, requests, clients, streams, frontends,
   status listeners), for leak tests. Any pointer may be NULL. */
int dc_handle_counts(uint64_t *contexts, uint64_t *queues, uint64_t *other);

/* Stores the number of goroutines and the bytes of live Go heap (after a
   garbage collection when collect is non-zero), for leak checks and
   benchmarks. Any pointer may be NULL. */
int dc_runtime_stats(int collect, uint64_t *goroutines, uint64_t *heap_bytes);


/* ------------------------------------------------------------------
   Runtime
   ------------------------------------------------------------------ */

/* Connects to the request plane and stores a runtime handle in *out. url
   (url_len bytes; NULL or empty for the default) is a NATS address; by default
   the NATS_SERVER environment variable or nats://127.0.0.1:4222, where an
   in-process server is started if nothing answers. Blocks while connecting
   (at most about 15 s). Errors: DC_EINVAL, DC_ECONNECT. */
int dc_runtime_new(const char *url, size_t url_len, uint64_t *out);

/* Shuts the runtime down: requests being served are killed (reason
   shutdown), instances leave discovery, streams end. The handle stays valid
   (calls on it fail with DC_ECLOSED) until dc_runtime_free. Idempotent. */
int dc_runtime_shutdown(uint64_t h);

/* Shuts the runtime down (as dc_runtime_shutdown) and frees its handle. */
int dc_runtime_free(uint64_t h);

/* Drains the runtime: every endpoint it serves leaves discovery at once and
   refuses the requests that still arrive (their callers send them to
   another instance: they never reached a worker), while the requests being
   served run on. dc_runtime_shutdown then ends whatever still runs (without
   a final marker: a caller with a migration limit continues it elsewhere).
   Idempotent. Errors: DC_EBADF, DC_ECLOSED. */
int dc_runtime_drain(uint64_t h);

/* Says that the host is awake: a host that calls it every DC_HOST_TICK_MS
   (from its event loop) is watched. When its last call is older than half
   the stream idle timeout (at least 0.5 s), the host is taken for stalled:
   its endpoints refuse new requests unstarted (their callers send them to
   another instance) and its streams send no heartbeats, so that their
   callers declare them silent and migrate them; all of it resumes at the
   next call. A host that never calls it is never taken for stalled.
   Errors: DC_EBADF. */
int dc_runtime_host_tick(uint64_t h);

/* Stores in *n the number of requests the runtime's endpoints are serving.
   Errors: DC_EBADF, DC_EINVAL for a NULL n. */
int dc_runtime_active(uint64_t h, uint64_t *n);

/* Copies the runtime's NATS URL into buf, as dc_context_id does. */
int dc_runtime_nats_url(uint64_t h, char *buf, size_t cap, size_t *len);


/* ------------------------------------------------------------------
   Endpoints (worker side)
   ------------------------------------------------------------------ */

/* Checks an endpoint path "namespace.component.endpoint": three non-empty
   parts without '.', '*', '>', whitespace or control characters (the one
   rule, used by dc_endpoint_serve and dc_client_new too).
   Errors: DC_EINVAL, with a message saying what is wrong. */
int dc_endpoint_path_check(const char *path, size_t len);

/* Checks one part of an endpoint path (a namespace, component or endpoint
   name) by the same rule. Errors: DC_EINVAL. */
int dc_endpoint_name_check(const char *name, size_t len);

/* Serves a new instance of the endpoint path ("namespace.component.endpoint")
   and stores its handle in *out. meta (may be NULL) is published with the
   instance. When meta is a model card with "max_num_seqs" N (and a mode other
   than "prefill"), the endpoint serves at most N requests at once: one past
   that is refused at once as busy, and its load is published on
   "dc.load.<path>" (docs/design.md, section 10).
   Errors: DC_EBADF, DC_EINVAL (bad path), DC_ECLOSED. */
int dc_endpoint_serve(uint64_t rt, const char *path, size_t path_len, const char *meta, size_t meta_len, uint64_t *out);

/* Stores the endpoint instance's id in *out. */
int dc_endpoint_instance_id(uint64_t h, uint64_t *out);

/* Records the engine's own figures for the endpoint's load reports (see
   dc_endpoint_serve): waiting, the requests its scheduler holds back, and
   kv_usage, the fraction of its KV cache in use (0 to 1; above 1 counts as
   1). A negative value leaves that figure out of the reports. Frontends
   route a new request away from an instance whose engine has requests
   waiting or a fuller KV cache (docs/design.md, section 10). Figures equal
   to the last ones change nothing; call it when they change (e.g. after
   an engine step). Nothing is published for an endpoint without a
   capacity. Errors: DC_EBADF, DC_EINVAL for a kv_usage that is not a
   finite number. */
int dc_endpoint_set_engine_load(uint64_t h, int64_t waiting, double kv_usage);

/* Stores the endpoint's count: the requests holding a place now in
   *running, its capacity in *capacity (0: none), and the requests it
   refused as busy so far in *refused. Errors: DC_EBADF, DC_EINVAL for a
   NULL pointer. */
int dc_endpoint_load(uint64_t h, int64_t *running, int64_t *capacity, uint64_t *refused);

/* Takes the oldest request waiting for a handler and stores its handle in
   *out. Errors: DC_EAGAIN (none waiting: dc_arm the endpoint), DC_ECLOSED
   (the endpoint was closed), DC_EBADF. */
int dc_endpoint_accept(uint64_t h, uint64_t *out);

/* Stops serving: the instance leaves discovery and requests being served are
   killed (reason shutdown); frees the handle. */
int dc_endpoint_free(uint64_t h);


/* ------------------------------------------------------------------
   Requests (worker side)
   ------------------------------------------------------------------ */

/* Copies the request's payload (a JSON value) into buf, as dc_context_id does. */
int dc_request_payload(uint64_t h, char *buf, size_t cap, size_t *len);

/* Copies the request's metadata (a JSON object, or nothing: *len = 0 when the
   caller sent none) into buf, as dc_context_id does. */
int dc_request_metadata(uint64_t h, char *buf, size_t cap, size_t *len);

/* Stores in *out a new context handle for the request's context (the
   handler's context: it has the caller's id and follows the caller's stop and
   kill). Free it with dc_context_free. */
int dc_request_context(uint64_t h, uint64_t *out);

/* Queues one response item (len bytes of JSON) for the caller; never blocks.
   Errors: DC_EAGAIN when the buffer is full (dc_arm the request, then retry),
   DC_EINVAL when data is not JSON. After a kill, items are dropped silently. */
int dc_request_send(uint64_t h, const char *data, size_t len);

/* Queues count items in order (items[i] is lens[i] bytes of JSON), as many
   as the buffer takes, with one wake-up of the stream's writer; stores how
   many it took in *sent. Errors: DC_EAGAIN when the buffer took fewer than
   count (dc_arm the request, then send the rest), DC_EINVAL when an item is
   not JSON (the items before it were queued), a NULL pointer, or more than
   DC_SEND_MANY_MAX items. After a kill, items are dropped silently (all count taken). */
int dc_request_send_many(uint64_t h, const char *const *items, const size_t *lens, size_t count, size_t *sent);

/* dc_request_send_many for n requests in one call: request hs[i] is given
   the next counts[i] items of items/lens (so items holds the sum of counts,
   in order). Stores in sent[i] how many it took and in rcs[i] its code, as
   dc_request_send_many's (DC_OK, DC_EAGAIN, DC_EBADF for a stale handle,
   DC_EINVAL for more than DC_SEND_MANY_MAX items, which are skipped...);
   one request's error leaves the others unaffected. Returns DC_EINVAL (and
   queues nothing, and stores nothing in sent and rcs) for a NULL pointer,
   more requests than DC_SEND_MULTI_MAX_REQUESTS, or more items in all than
   DC_SEND_MULTI_MAX_ITEMS (counting only the requests within
   DC_SEND_MANY_MAX). One call into the library however many requests: the
   worker's event loop hands over a decode step's items with it. */
int dc_request_send_multi(const uint64_t *hs, const size_t *counts, size_t n, const char *const *items, const size_t *lens,
                          size_t *sent, int *rcs);

/* Ends the request normally: queued items, then the final marker (unless the
   handler stopped its own context: then the caller sees an incomplete
   stream). */
int dc_request_complete(uint64_t h);

/* Ends the request with a handler error; msg is "<Type>: <message>". */
int dc_request_fail(uint64_t h, const char *msg, size_t len);

/* Frees a request handle; a request neither completed nor failed is failed. */
int dc_request_free(uint64_t h);

/* Stores in *fd the write end of the library's post socket: a non-blocking
   Unix SOCK_SEQPACKET socket through which the library's own Python module
   hands over, without a call into the library, the calls it makes at every
   engine step or on a timer and whose answer it does not wait for (a step's
   items, dc_runtime_host_tick, dc_endpoint_set_engine_load). A thread of
   the library runs each message in the order written; the calls that act
   on a request, and those two, run the messages posted before them first,
   so that a request's items come before its end. The messages'
   format, and when a host may post items, are this library version's own
   (go/native/posted.go): other hosts make the calls. The fd belongs to the
   library: never close it. Errors: DC_EINVAL for NULL, DC_EIO if the socket
   could not be made. */
int dc_post_fd(int *fd);


/* ------------------------------------------------------------------
   Clients (caller side)
   ------------------------------------------------------------------ */

/* Creates a client of the endpoint path and stores its handle in *out. Blocks
   briefly (about 100 ms) to learn the current instances. */
int dc_client_new(uint64_t rt, const char *path, size_t path_len, uint64_t *out);

/* Copies the ids of the instances the client knows into buf (up to cap) and
   stores their number in *n. Errors: DC_ERANGE if cap < *n. */
int dc_client_instances(uint64_t h, uint64_t *buf, size_t cap, size_t *n);

/* Sends a request (payload: len bytes of JSON) and stores the response
   stream's handle in *out without waiting. ctx (0 for none) is the caller's
   context: the request gets a child of it (same id, linked before sending);
   route is 0 round robin, 1 random, 2 direct to instance. Errors: DC_EBADF,
   DC_EINVAL (not JSON, bad route), DC_ECLOSED; failures to reach a worker are
   reported by the stream. */
int dc_client_generate(uint64_t h, const char *payload, size_t payload_len, uint64_t ctx, int route, uint64_t instance, uint64_t *out);

/* dc_client_generate with request metadata: metaLen bytes at meta, a JSON
   object of at most 16 KiB (metaLen 0: none), which the handler's side reads
   with dc_request_metadata. Errors: those of dc_client_generate; DC_EINVAL
   for metadata that is not a JSON object or is too large. */
int dc_client_generate_metadata(uint64_t h, const char *payload, size_t payload_len, const char *meta, size_t meta_len, uint64_t ctx, int route, uint64_t instance, uint64_t *out);

/* Sets how many times the client's requests are retried on another worker
   when their stream breaks (migration; 0, the default, means never).
   Errors: DC_EBADF, DC_EINVAL for a negative limit. */
int dc_client_set_migration_limit(uint64_t h, int limit);

/* Stops watching instances and frees the client handle. */
int dc_client_free(uint64_t h);


/* ------------------------------------------------------------------
   Response streams (caller side)
   ------------------------------------------------------------------ */

/* Reports whether the stream's request reached a worker: DC_OK once it did,
   DC_EAGAIN while in flight (dc_arm the stream), or the error that ended it
   (DC_ENORESPONDERS, ...). */
int dc_stream_started(uint64_t h);

/* Moves as many whole items as fit into buf, each as a 4-byte little-endian
   length followed by that many bytes of JSON, and stores the bytes used in
   *used and the item count in *count. With no item ready it returns
   DC_EAGAIN (dc_arm the stream), DC_EOF at the normal end, or the stream's
   error (DC_EHANDLER, DC_EINCOMPLETE, DC_ENORESPONDERS, ...). If the first
   item does not fit: DC_ERANGE with the size needed in *used. Once the
   request's context or the caller's context it was made for is killed, no
   item is returned (DC_EOF, or the error that had ended the stream): a kill
   is a hard abort, whatever was buffered is dropped. */
int dc_stream_take(uint64_t h, char *buf, size_t cap, size_t *used, size_t *count);

/* Stores in *out a new context handle for the stream's request context (a
   child of the caller's context, with the same id). */
int dc_stream_context(uint64_t h, uint64_t *out);

/* Kills the stream's request (the worker's handler context is killed) and
   ends the stream. Idempotent. */
int dc_stream_kill(uint64_t h);

/* Stores in *out 1 if the stream's request or the caller's context it was
   made for is killed (from then on no item may be delivered, buffered ones
   included: a host that holds taken items checks this before each), else 0.
   Errors: DC_EBADF, DC_EINVAL for a NULL out. */
int dc_stream_killed(uint64_t h, int *out);

/* Frees a stream handle, killing the request if the stream has not ended. */
int dc_stream_free(uint64_t h);


/* ------------------------------------------------------------------
   Readiness
   ------------------------------------------------------------------ */

/* Pushes token onto queue q once the object h may have progressed: an
   endpoint has a request to accept (or closed), a request's send buffer has
   room, a client knows an instance, a stream has items, started or ended, a
   status listener has a request for the host to answer (or closed).
   At once if that is already so. One pending arm per object: a second
   replaces the first. Errors: DC_EBADF for either handle or a handle of
   another kind. */
int dc_arm(uint64_t h, uint64_t q, uint64_t token);

#ifdef __cplusplus
}
#endif

/* The host's services: logging, the status listener, traces, the HTTP
   frontend (a file of their own, included here: include this one). */
#include "dynamo_ctx_services.h"

#endif /* DC_ENUMS_ONLY */
#endif /* DYNAMO_CTX_H */
