/* dynamo_ctx_services.h: the services the dynamo-ctx native library
   offers its host: logging, the status listener, traces and the
   OpenAI-compatible HTTP frontend. Part of the C ABI whose reference is
   dynamo_ctx.h, which includes this file (include that one); its
   conventions hold here too. */
#ifndef DYNAMO_CTX_SERVICES_H
#define DYNAMO_CTX_SERVICES_H

#include "dynamo_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------
   Logging
   ------------------------------------------------------------------ */

/* Stores in *fd a descriptor that is readable whenever log records are
   waiting for dc_log_next. The fd belongs to the library: never read or close
   it. Errors: DC_EINVAL for NULL, DC_EIO if the library has no log queue. */
int dc_log_fd(int *fd);

/* Sets the lowest level (Python's numbers: 10 debug, 20 info, 30 warning, 40
   error) of the records the library queues; the default is 30. */
int dc_log_set_level(int level);

/* Takes the oldest log record: its level in *level (Python's numbers) and its
   message into buf, as dc_context_id does. Errors: DC_EAGAIN when no record
   is waiting; DC_ERANGE when buf is too small (*len is set and the record stays
   first in line); DC_EINVAL for NULL level or len. */
int dc_log_next(int *level, char *buf, size_t cap, size_t *len);


/* ------------------------------------------------------------------
   Status listener: a process's status endpoints (/metrics, /health, ...)
   over HTTP, each answer rendered by the host
   ------------------------------------------------------------------ */

/* Starts a status listener on fd, a listening TCP socket of the caller's
   (the library serves a copy of it: the caller may close its own at once;
   binding the port is the caller's, so that it may bind before it loads
   the library) and stores its handle in *out. paths (paths_len bytes) are
   the paths the host answers, separated by '\n': each "/" then printable
   ASCII (no space, no '?'), at most DC_STATUS_PATH_MAX - 1 bytes. A GET or
   HEAD of one of them waits for the host's answer (dc_status_next,
   dc_status_answer); another method is 405, another path 404, a query
   string is ignored. Each connection is closed after its answer. Bounds (0:
   the default): read_timeout, the seconds a client has to send its
   request's line and headers (10; at most 16 KiB of them); max_connections
   (64), the connections held before their request's headers arrived (one
   more closes the oldest of them at once) and the requests waiting for the
   host's answer (one more is answered 503 at once); answer_timeout (2), the
   seconds the host has to answer, else the client gets 503. The listener's
   connection policy is the frontend's (docs/security.md). Errors: DC_EINVAL
   for NULL pointers, an fd that is not a listening socket, a bad path or
   bound; DC_EIO. */
int dc_status_start(int fd, const char *paths, size_t paths_len, double read_timeout, int max_connections,
                    double answer_timeout, uint64_t *out);

/* Copies the address the status listener listens on into buf, as
   dc_context_id does. */
int dc_status_addr(uint64_t h, char *buf, size_t cap, size_t *len);

/* Takes the oldest request waiting for the host's answer: its id in *id and
   its path into path (cap at least DC_STATUS_PATH_MAX), as dc_context_id
   does. Errors: DC_EAGAIN (none waits: dc_arm the listener), DC_ECLOSED,
   DC_EBADF, DC_EINVAL for NULL pointers or a smaller cap. */
int dc_status_next(uint64_t h, uint64_t *id, char *path, size_t cap, size_t *len);

/* Answers the request id with the HTTP status code (200 to 599), a content
   type (ct_len bytes of printable ASCII, at most 256; none when 0) and a
   body (body_len bytes, at most 64 MiB; a HEAD request gets its length
   only). Errors: DC_ENOENT when the request no longer waits (its client left,
   or answer_timeout passed: it was answered 503), DC_EINVAL for a status,
   content type or body out of bounds, DC_ECLOSED, DC_EBADF. */
int dc_status_answer(uint64_t h, uint64_t id, int code, const char *content_type, size_t ct_len, const char *body,
                     size_t body_len);

/* Closes the status listener at once (its connections too: the requests
   waiting for an answer end) and frees its handle; an armed token is pushed.
   Errors: DC_EBADF. */
int dc_status_free(uint64_t h);

/* ------------------------------------------------------------------
   Tracing (OpenTelemetry, docs/design.md "Traces")
   ------------------------------------------------------------------ */

/* The library makes every span, the host's too, and exports them over OTLP
   as the OTEL_* variables say (off without an endpoint): these let a host
   trace its own work under the span the library attached to a context (a
   worker's handler), with no OpenTelemetry of its own. Attributes are
   attrs_len bytes of one JSON object (none when 0) whose values are
   strings, numbers, booleans or arrays of one of them; a name is at most
   256 bytes, attributes at most 64 KiB (else DC_EINVAL). */

/* 1 while this process makes spans, 0 otherwise: read without a call (an
   atomic load), so that a host's span calls cost nothing while tracing is
   off. Set when a runtime turns tracing on, cleared when the last one shuts
   down. */
extern uint32_t dc_trace_on;

/* Starts a span, a child of the span attached to the context ctx, and stores
   its handle in *out; stores 0 (and succeeds) when tracing is off or the
   context has no span. An empty name is the parent's GenAI name
   ("{operation} {model}"). The handle is freed by dc_trace_span_end.
   Errors: DC_EBADF for ctx, DC_EINVAL for a NULL out or bad arguments. */
int dc_trace_span_start(uint64_t ctx, const char *name, size_t name_len, const char *attrs, size_t attrs_len,
                        uint64_t *out);

/* Adds an event named name, with attributes, to the span.
   Errors: DC_EBADF, DC_EINVAL for bad arguments. */
int dc_trace_span_event(uint64_t span, const char *name, size_t name_len, const char *attrs, size_t attrs_len);

/* Sets the attributes on the span, marks it failed when failed is not 0,
   ends it and frees its handle. Errors: DC_EBADF, DC_EINVAL for bad
   arguments (the span is then left open). */
int dc_trace_span_end(uint64_t span, const char *attrs, size_t attrs_len, int failed);

/* Adds an event to the span attached to the context ctx (nothing when it has
   none, or tracing is off). Errors: DC_EBADF, DC_EINVAL for bad arguments. */
int dc_trace_context_event(uint64_t ctx, const char *name, size_t name_len, const char *attrs, size_t attrs_len);

/* ------------------------------------------------------------------
   HTTP frontend
   ------------------------------------------------------------------ */

/* Starts the OpenAI-compatible HTTP frontend on the runtime, configured by
   settings (settings_len bytes: one JSON object), and stores its handle in
   *out. The settings' members, each optional:
     "addr"                  the listen address, "127.0.0.1:8000" (without
                             one: a free port on every address);
     "namespace"             where workers serve "<namespace>.backend.generate"
                             (default "dynamo");
     "migration_limit"       a whole number overriding the limit the model's
                             workers declare (default, or below 0: theirs);
     "max_body_bytes"        the largest request body, bytes (default 4 MiB);
     "max_idle_connections"  the bound of connections not serving a request
                             (default 1024);
     "request_timeout"       every request's default timeout, seconds, as the
                             x-request-timeout header gives them (default none);
     "max_queued_requests"   a model's queue of requests waiting for a worker
                             with a free place (default 1024; 0: none).
   The last four are given as a user gave them, {"text": "...", "source":
   "..."}: the text, which the library parses (their one parser), and where
   it came from (a flag, "--max-body-bytes", or a variable,
   "DYNAMO_CTX_MAX_BODY_BYTES"; default the member's name), which a refusal
   names. The library reads no environment variable for them: the host
   resolves its own (the command: the flag, else the variable). A member
   the library does not know, or names only up to case or twice, is
   refused. Errors: DC_EBADF; DC_EINVAL for settings that are not such an
   object, or a setting refused (the message begins with its source and the
   text: --flag "text": why, or NAME="text": why); DC_EIO (cannot listen). */
int dc_frontend_start(uint64_t rt, const char *settings, size_t settings_len, uint64_t *out);

/* Checks settings as dc_frontend_start would and starts nothing: a host
   checks them before it connects. Errors: DC_EINVAL, with
   dc_frontend_start's message. */
int dc_frontend_check_settings(const char *settings, size_t settings_len);

/* Copies the address the frontend listens on into buf, as dc_context_id does. */
int dc_frontend_addr(uint64_t h, char *buf, size_t cap, size_t *len);

/* Stops the frontend (as dc_frontend_drain with 5 s, unless it was
   drained) and frees its handle. */
int dc_frontend_free(uint64_t h);

/* Drains the frontend: it stops accepting at once, lets the requests in
   flight finish for up to seconds, then kills those still running with
   DC_REASON_SHUTDOWN (their clients get a 503 or a final SSE error event,
   code "shutdown") and stops. Only the first drain (or free) waits. Errors:
   DC_EBADF; DC_EINVAL for seconds that is not a finite number, 0 or more,
   below DC_MAX_TIMEOUT_SECONDS. */
int dc_frontend_drain(uint64_t h, double seconds);

/* ------------------------------------------------------------------
   Engine outputs: a vLLM engine core's output stream, read by the library
   in its host's place (docs/design.md, "Engine outputs in the library")
   ------------------------------------------------------------------ */

/* Listens on the Unix socket path (path_len bytes; it must not exist) as
   the PULL side of ZeroMQ's ZMTP 3 with the NULL mechanism, where an
   engine core's PUSH socket connects, and stores the reader's handle in
   *out and in *fd the read end of a pipe (non-blocking, close-on-exec)
   that carries it every message of the engine, in the order read (the
   host's to read, and to close after dc_engine_outputs_free; the library
   closes the write end once freed): each is its length (u32), the
   count of its frames (u32), each frame's length (u32) and bytes, then the
   count of outputs flagged (u32, 0 for a message the library could not
   read) and a byte per output: 1 where the library delivered its tokens
   to the request's stream, 2 where it did and one of the output's 'x'
   fields is set, 0 where it did not (then, or once the request's context
   stopped, that output and every later one of its request are the
   host's). Little-endian. The listening socket's file is made its owner's only
   (mode 0600), whatever the umask, and on Linux a peer of another user
   is closed at once.
   message_layout and output_layout say what each field of the engine's
   EngineCoreOutputs and EngineCoreOutput is, a letter per field in order
   (go/engineout's Layout: 'o' the outputs, 'f' a field the host acts on at
   once when set, 'a' read by the host only; 'i' the request id, 't' the
   new token ids, 'n' a field whose being set leaves the output to the
   host, 'x' one whose being set makes the host take the output its own
   way at once, its tokens still delivered). suffix is how many trailing
   bytes of an output's request id the engine added to the id routes are
   reserved under. window (0 to 1 seconds): a message whose outputs were
   all delivered (or that has none) waits to go to the host with later
   ones until one comes window or more after the first that waits, or one
   the host must have at once, or the host's next tick
   (dc_runtime_host_tick).
   Before each message, what the host posted runs (its routes, posted:
   dc_post_fd), so a route reserved before its request reached the engine
   is in place for the request's first output.
   Errors: DC_EINVAL for NULL pointers, bad layouts or bounds; DC_EIO
   (cannot listen). */
int dc_engine_outputs_listen(const char *path, size_t path_len, const char *message_layout, size_t message_len,
                             const char *output_layout, size_t output_len, size_t suffix, double window,
                             uint64_t *out, int *fd);

/* Reserves a route for request id (id_len bytes), before the engine has
   the request; dc_engine_outputs_activate arms it. Errors: DC_EBADF;
   DC_EINVAL for a NULL id. */
int dc_engine_outputs_reserve(uint64_t h, const char *id, size_t id_len);

/* Arms the reserved route of the request the engine knows as id (id_len
   bytes: the reserved id and the suffix the engine added) to the served
   request's stream (dc_request handle request): from now on its plain
   outputs' tokens go
   there from the library, as items {"token_ids": [...]}, until its first
   output that is not plain, which is the host's, as every later one. Sets
   *armed to 1, or to 0 (and drops the route) where an output of it went by
   since it was reserved, it was not reserved, or it was armed already: its
   outputs are then all the host's. Where the reader holds the engine's
   input socket (dc_engine_inputs_listen), an armed route's request is
   aborted in the engine by the library the moment its context stops,
   until dc_engine_outputs_drop; a kill of that context reaches its
   watches (dc_context_watch) 5 ms after that abort left. Errors:
   DC_EBADF (for either handle: the route is dropped); DC_EINVAL for NULL
   pointers. */
int dc_engine_outputs_activate(uint64_t h, const char *id, size_t id_len, uint64_t request, int *armed);

/* Drops request id's route: its outputs are the host's from now on.
   Errors: DC_EBADF; DC_EINVAL for a NULL id. */
int dc_engine_outputs_drop(uint64_t h, const char *id, size_t id_len);

/* Stores in *n how many engine connections the reader holds past their
   handshake (the engine core's, once it connected). Errors: DC_EBADF;
   DC_EINVAL for NULL. */
int dc_engine_outputs_peers(uint64_t h, int *n);

/* Stores in *tokens how many tokens the library delivered so far. Errors:
   DC_EBADF; DC_EINVAL for NULL. */
int dc_engine_outputs_sent(uint64_t h, int64_t *tokens);

/* Stops listening (for the outputs and the inputs), closes the engine's
   connections and frees the handle; messages not taken or not sent are
   dropped. Errors: DC_EBADF. */
int dc_engine_outputs_free(uint64_t h);

/* Reader h takes the engine core's input socket too: it listens on the
   Unix socket path (path_len bytes; it must not exist; mode 0600 as the
   outputs') as the ROUTER side of ZeroMQ's ZMTP 3 with the NULL mechanism,
   where the engine core's DEALER socket of routing id identity (1 to 255
   bytes) connects. From then on the host sends the engine its messages
   through the library (dc_engine_inputs_send, or posted), and the library
   aborts an armed route's request itself once its context stops
   (dc_engine_outputs_activate): a message of two frames, abort_type (1 to
   16 bytes: vLLM's EngineCoreRequestType.ABORT) and MessagePack's array of
   the request's id. Once per reader. Errors: DC_EBADF; DC_EINVAL for NULL
   pointers, bounds, or a reader that holds the inputs already; DC_EIO
   (cannot listen). */
int dc_engine_inputs_listen(uint64_t h, const char *path, size_t path_len, const char *identity, size_t identity_len,
                            const char *abort_type, size_t abort_type_len);

/* Sends one message to the engine through reader h's input socket, never
   waiting (what the socket does not take now is queued, unbounded, as a
   ROUTER socket's with no high-water mark), in order with every earlier
   one and with the library's aborts: msg (msg_len bytes) is its frame
   count (u32, at least 2), then each frame's length (u32) and bytes,
   little-endian; the first frame is the routing id of the peer it goes to
   (a message to a peer not connected is dropped, as a ROUTER socket drops
   it). Errors: DC_EBADF; DC_EINVAL for NULL, a malformed msg, or a reader
   without the inputs. */
int dc_engine_inputs_send(uint64_t h, const char *msg, size_t msg_len);

/* Sends the engine an abort of the request it knows as id (id_len bytes),
   as the library does on a stop. Errors: DC_EBADF; DC_EINVAL for NULL or a
   reader without the inputs. */
int dc_engine_inputs_abort(uint64_t h, const char *id, size_t id_len);

/* Stores in *n how many engine connections reader h's input socket holds
   past their handshake. Errors: DC_EBADF; DC_EINVAL for NULL or a reader
   without the inputs. */
int dc_engine_inputs_peers(uint64_t h, int *n);

/* Stores in *n how many aborts the library sent the engine through reader
   h (on stops, and dc_engine_inputs_abort's) to a connected engine.
   Errors: DC_EBADF; DC_EINVAL for NULL or a reader without the inputs. */
int dc_engine_inputs_aborts(uint64_t h, int64_t *n);

#ifdef __cplusplus
}
#endif

#endif /* DYNAMO_CTX_SERVICES_H */
