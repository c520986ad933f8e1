// The CPython extension module dynamo_ctx._native, in the same shared library
// as the C ABI it wraps. Thin by design: the Context type, argument
// conversion, GIL release and error translation; all logic is in Go.
//
// Built against the stable ABI (Py_LIMITED_API 3.9), so one library serves
// every CPython from 3.9 on. Compiled only when Python.h is on the include
// path (build.py puts it there); without it the library is the plain C ABI.
#if defined(__has_include)
#if __has_include(<Python.h>)
#define DC_WITH_PYTHON 1
#endif
#endif

#ifdef DC_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03090000
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dynamo_ctx.h" // the public header: the library's own functions, const-correct

// Every Python symbol this file uses is a weak reference, so the library
// loads (and its plain C ABI works) in a process without an interpreter: the
// interpreter, when there is one, resolves them at import. Keep the list
// complete: python/tests/test_packaging.py fails on a strong Python symbol.
#pragma weak PyBytes_AsStringAndSize
#pragma weak PyBytes_FromStringAndSize
#pragma weak PyDict_New
#pragma weak PyDict_Next
#pragma weak PyDict_SetItem
#pragma weak PyDict_Type
#pragma weak PyErr_Clear
#pragma weak PyErr_Format
#pragma weak PyErr_NoMemory
#pragma weak PyErr_Occurred
#pragma weak PyErr_SetFromErrno
#pragma weak PyErr_SetObject
#pragma weak PyErr_SetString
#pragma weak PyEval_RestoreThread
#pragma weak PyEval_SaveThread
#pragma weak PyExc_OSError
#pragma weak PyExc_RuntimeError
#pragma weak PyExc_TypeError
#pragma weak PyExc_ValueError
#pragma weak PyFloat_AsDouble
#pragma weak PyFloat_FromDouble
#pragma weak PyImport_ImportModule
#pragma weak PyList_Append
#pragma weak PyList_GetItem
#pragma weak PyList_New
#pragma weak PyList_SetItem
#pragma weak PyList_Size
#pragma weak PyList_Type
#pragma weak PyLong_AsLong
#pragma weak PyLong_AsLongLongAndOverflow
#pragma weak PyLong_AsUnsignedLongLong
#pragma weak PyLong_FromLong
#pragma weak PyLong_FromSize_t
#pragma weak PyLong_FromUnsignedLong
#pragma weak PyLong_FromUnsignedLongLong
#pragma weak PyLong_Type
#pragma weak PyMem_Free
#pragma weak PyMem_Malloc
#pragma weak PyMem_Realloc
#pragma weak PyModule_AddIntConstant
#pragma weak PyModule_AddObject
#pragma weak PyModule_AddStringConstant
#pragma weak PyModule_Create2
#pragma weak PyObject_CallFunction
#pragma weak PyObject_CallFunctionObjArgs
#pragma weak PyObject_GetAttrString
#pragma weak PyObject_IsInstance
#pragma weak PyObject_IsSubclass
#pragma weak PyObject_SetAttrString
#pragma weak PyObject_Type
#pragma weak PyTuple_GetItem
#pragma weak PyTuple_New
#pragma weak PyTuple_SetItem
#pragma weak PyTuple_Size
#pragma weak PyTuple_Type
#pragma weak PyType_FromSpec
#pragma weak PyType_GetFlags
#pragma weak PyType_GetSlot
#pragma weak PyUnicode_AsUTF8String
#pragma weak PyUnicode_DecodeUTF8
#pragma weak PyUnicode_FromString
#pragma weak PyUnicode_GetLength
#pragma weak PyUnicode_ReadChar
#pragma weak PyUnicode_Type
#pragma weak _PyArg_ParseTupleAndKeywords_SizeT
#pragma weak _PyArg_ParseTuple_SizeT
#pragma weak _PyObject_CallFunction_SizeT
#pragma weak _Py_BuildValue_SizeT
#pragma weak _Py_Dealloc
#pragma weak _Py_FalseStruct
#pragma weak _Py_NoneStruct
#pragma weak _Py_TrueStruct

// The Go runtime's threads do not survive fork(): a call into Go in the child
// would hang. The child handler marks the process, and every method that
// would enter Go raises instead. is_stopped/is_killed only read memory and
// keep working.
static volatile int dc_forked = 0;
static pid_t dc_loaded_pid = 0;
static void dc_atfork_child(void) { dc_forked = 1; }

static int check_fork(void) {
    if (dc_forked) {
        PyErr_Format(PyExc_RuntimeError,
                     "dynamo_ctx: the native library was loaded in process %d and cannot be "
                     "used in a child forked from it (the Go runtime does not survive fork); "
                     "use the 'spawn' or 'forkserver' start method, or create contexts only "
                     "after forking",
                     (int)dc_loaded_pid);
        return -1;
    }
    return 0;
}

// python_function returns (and caches in *cache) the function name of the
// package module mod, importing it on first use; NULL with the error
// cleared if it cannot (the caller falls back). The module keeps it alive.
static PyObject* python_function(PyObject** cache, const char* mod, const char* name) {
    if (*cache == NULL) {
        PyObject* m = PyImport_ImportModule(mod);
        if (m != NULL) {
            *cache = PyObject_GetAttrString(m, name);
            Py_DECREF(m);
        }
        if (*cache == NULL) PyErr_Clear();
    }
    return *cache;
}

// Raises the exception for error code rc with the calling thread's last error
// message. Which exception is Python's business: the one table is
// dynamo_ctx.runtime._exception_for(code, message).
static PyObject* raise_rc(int rc) {
    char msg[1024];
    dc_last_error(msg, sizeof msg);
    static PyObject* exception_for = NULL;
    if (python_function(&exception_for, "dynamo_ctx.runtime", "_exception_for") == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s (code %d)", msg, rc);
        return NULL;
    }
    PyObject* exc = PyObject_CallFunction(exception_for, "is", rc, msg);
    if (exc == NULL) return NULL; // the table itself raised
    PyObject* type = PyObject_Type(exc);
    PyErr_SetObject(type, exc);
    Py_DECREF(type);
    Py_DECREF(exc);
    return NULL;
}

// After this thread cancelled a context: dynamo_ctx._aio._flush_local()
// delivers at once what the cancellation woke on this thread's running event
// loop (an in-process handler, a waiter), rather than after the loop's next
// poll of its fd. It returns None and never raises.
static PyObject* flush_local(void) {
    static PyObject* flush = NULL;
    if (python_function(&flush, "dynamo_ctx._aio", "_flush_local") == NULL) Py_RETURN_NONE; // the fd delivers it
    return PyObject_CallFunctionObjArgs(flush, NULL);
}

// ---------------------------------------------------------------- Context

// A Context made in Python has no Go side until something needs one: a link,
// a child, an await, a request sent with it, its handle. Until then its state
// lives in inline_word (same encoding as the library's state word: state,
// reason << 8, cause << 16) and its id in id (NULL: a uuid not drawn yet), so
// creating and dropping a context never enters Go. Materializing creates the
// Go context with that id and state and points word at the library's word.
// Everything here runs with the GIL held, so no cancel can slip between
// reading inline_word and switching word.
typedef struct {
    PyObject_HEAD
    uint64_t handle;         // 0 while there is no Go side (or once released)
    const uint32_t* word;    // &inline_word, or the library's state word while handle is valid
    PyObject* id;            // str; NULL for a uuid not drawn yet, or an id not fetched yet
    uint32_t inline_word;    // the state while there is no Go side
} ContextObject;

static PyTypeObject* ContextType; // set at module init; the module keeps it alive

// Gives the context its Go side if it has none. -1 with an exception set on failure.
static int materialize(ContextObject* self) {
    if (self->handle != 0) return 0;
    if (check_fork() < 0) return -1;
    uint64_t h = 0;
    int rc;
    if (self->id == NULL) {
        rc = dc_context_new_uuid(&h);
    } else {
        PyObject* b = PyUnicode_AsUTF8String(self->id);
        if (b == NULL) return -1;
        char* s;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(b, &s, &n) < 0) {
            Py_DECREF(b);
            return -1;
        }
        rc = dc_context_new(s, (size_t)n, &h);
        Py_DECREF(b);
    }
    if (rc != DC_OK) {
        raise_rc(rc);
        return -1;
    }
    uint32_t w = self->inline_word;
    if ((w & 0xff) != DC_LIVE) rc = dc_context_cancel(h, w & 0xff, (w >> 8) & 0xff);
    const uint32_t* word = NULL;
    if (rc == DC_OK) rc = dc_context_state_word(h, &word);
    if (rc != DC_OK) {
        dc_context_free(h);
        raise_rc(rc);
        return -1;
    }
    self->handle = h;
    self->word = word;
    return 0;
}

static PyObject* context_wrap(PyTypeObject* tp, uint64_t h) {
    const uint32_t* word = NULL;
    int rc = dc_context_state_word(h, &word);
    if (rc != DC_OK) {
        dc_context_free(h);
        return raise_rc(rc);
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    ContextObject* self = (ContextObject*)alloc(tp, 0);
    if (self == NULL) {
        dc_context_free(h);
        return NULL;
    }
    self->handle = h;
    self->word = word;
    self->id = NULL;
    self->inline_word = 0;
    return (PyObject*)self;
}

static int context_check(PyObject* o) {
    int r = PyObject_IsInstance(o, (PyObject*)ContextType);
    if (r == 0) PyErr_SetString(PyExc_TypeError, "expected a dynamo_ctx.Context");
    return r == 1 ? 0 : -1;
}

// An id the library accepts: 1 to DC_MAX_ID_LEN bytes of UTF-8, no NUL (the
// same rule dc_context_new applies; checked here because the Go side is made
// later). Returns 0, or -1 with ValueError/UnicodeEncodeError set.
static int check_id(PyObject* id) {
    PyObject* b = PyUnicode_AsUTF8String(id); // surrogates raise UnicodeEncodeError
    if (b == NULL) return -1;
    char* s;
    Py_ssize_t n;
    int ok = PyBytes_AsStringAndSize(b, &s, &n) == 0;
    if (ok && (n == 0 || n > DC_MAX_ID_LEN)) {
        PyErr_Format(PyExc_ValueError, "Context id must be 1 to %d bytes of UTF-8, got %zd", DC_MAX_ID_LEN, n);
        ok = 0;
    } else if (ok && memchr(s, 0, (size_t)n) != NULL) {
        PyErr_SetString(PyExc_ValueError, "Context id contains a NUL character");
        ok = 0;
    }
    Py_DECREF(b);
    return ok ? 0 : -1;
}

static PyObject* context_new(PyTypeObject* tp, PyObject* args, PyObject* kwds) {
    static char* kwlist[] = {"id", NULL};
    PyObject* id = Py_None;
    if (kwds != NULL || PyTuple_Size(args) != 0) {
        if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Context", kwlist, &id)) return NULL;
    }
    if (check_fork() < 0) return NULL;
    if (id != Py_None) {
        if (!PyUnicode_Check(id)) {
            PyErr_SetString(PyExc_TypeError, "Context id must be a str or None");
            return NULL;
        }
        if (check_id(id) < 0) return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    ContextObject* self = (ContextObject*)alloc(tp, 0);
    if (self == NULL) return NULL;
    self->handle = 0;
    self->inline_word = 0;
    self->word = &self->inline_word;
    if (id != Py_None) Py_INCREF(id);
    self->id = id == Py_None ? NULL : id;
    return (PyObject*)self;
}

static void context_dealloc(PyObject* o) {
    ContextObject* self = (ContextObject*)o;
    PyTypeObject* tp = Py_TYPE(o);
    uint64_t h = self->handle;
    self->handle = 0;
    Py_CLEAR(self->id);
    if (h != 0 && !dc_forked) {
        Py_BEGIN_ALLOW_THREADS
        dc_context_free(h);
        Py_END_ALLOW_THREADS
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(o);
    Py_DECREF(tp); // instances of heap types own a reference to their type
}

static inline uint32_t load_word(ContextObject* self) {
    return __atomic_load_n(self->word, __ATOMIC_ACQUIRE);
}

static PyObject* context_is_stopped(PyObject* o, PyObject* unused) {
    if ((load_word((ContextObject*)o) & 0xff) >= DC_STOPPED) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject* context_is_killed(PyObject* o, PyObject* unused) {
    if ((load_word((ContextObject*)o) & 0xff) == DC_KILLED) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject* context_state_word(PyObject* o, PyObject* unused) {
    return PyLong_FromUnsignedLong(load_word((ContextObject*)o));
}

static PyObject* context_id(PyObject* o, PyObject* unused) {
    ContextObject* self = (ContextObject*)o;
    if (self->id == NULL) {
        if (materialize(self) < 0) return NULL; // draws the uuid
        if (check_fork() < 0) return NULL;
        char small[128];
        size_t n = 0;
        int rc = dc_context_id(self->handle, small, sizeof small, &n);
        if (rc == DC_OK) {
            self->id = PyUnicode_DecodeUTF8(small, (Py_ssize_t)n, "strict");
        } else if (rc == DC_ERANGE) {
            char* big = PyMem_Malloc(n + 1);
            if (big == NULL) return PyErr_NoMemory();
            rc = dc_context_id(self->handle, big, n + 1, &n);
            if (rc == DC_OK) self->id = PyUnicode_DecodeUTF8(big, (Py_ssize_t)n, "strict");
            PyMem_Free(big);
            if (rc != DC_OK) return raise_rc(rc);
        } else {
            return raise_rc(rc);
        }
        if (self->id == NULL) return NULL;
    }
    Py_INCREF(self->id);
    return self->id;
}

static PyObject* context_handle(PyObject* o, PyObject* unused) {
    if (materialize((ContextObject*)o) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(((ContextObject*)o)->handle);
}

// Calls that take locks in Go (a cancel may walk a large tree) release the GIL.
#define CALL_RELEASED(rc, expr) \
    do {                          \
        Py_BEGIN_ALLOW_THREADS    \
        rc = (expr);              \
        Py_END_ALLOW_THREADS      \
    } while (0)

static PyObject* context_cancel_with(PyObject* o, uint32_t state, uint32_t reason) {
    ContextObject* self = (ContextObject*)o;
    if (self->handle == 0) {
        // No Go side: nothing links to it, nothing awaits it. The word moves
        // forward only (a stop after a kill changes nothing), with the same
        // encoding the library uses (the cause of a direct cancel is its reason).
        if (state != DC_STOPPED && state != DC_KILLED) {
            PyErr_Format(PyExc_ValueError, "state must be STOPPED or KILLED, got %u", state);
            return NULL;
        }
        if (reason == DC_REASON_NONE || reason > DC_REASON_SHUTDOWN) {
            PyErr_Format(PyExc_ValueError, "unknown reason %u", reason);
            return NULL;
        }
        if ((self->inline_word & 0xff) < state)
            __atomic_store_n(&self->inline_word, state | (reason << 8) | (reason << 16), __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_context_cancel(((ContextObject*)o)->handle, state, reason));
    if (rc != DC_OK) return raise_rc(rc);
    return flush_local();
}

static PyObject* context_stop_generating(PyObject* o, PyObject* unused) {
    return context_cancel_with(o, DC_STOPPED, DC_REASON_STOP_GENERATING);
}

static PyObject* context_kill(PyObject* o, PyObject* unused) {
    return context_cancel_with(o, DC_KILLED, DC_REASON_KILL);
}

static PyObject* context_cancel(PyObject* o, PyObject* args) {
    unsigned int state, reason;
    if (!PyArg_ParseTuple(args, "II:_cancel", &state, &reason)) return NULL;
    return context_cancel_with(o, state, reason);
}

static PyObject* context_link_child(PyObject* o, PyObject* child) {
    if (context_check(child) < 0) return NULL;
    if (materialize((ContextObject*)o) < 0 || materialize((ContextObject*)child) < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_context_link_child(((ContextObject*)o)->handle, ((ContextObject*)child)->handle));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* context_child(PyObject* o, PyObject* unused) {
    if (materialize((ContextObject*)o) < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_context_child(((ContextObject*)o)->handle, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return context_wrap(Py_TYPE(o), h);
}

static PyObject* context_set_timeout(PyObject* o, PyObject* arg) {
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    if (materialize((ContextObject*)o) < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_context_set_timeout(((ContextObject*)o)->handle, seconds));
    if (rc != DC_OK) return raise_rc(rc);
    return flush_local(); // a timeout of 0 kills at once
}

static PyObject* context_remaining(PyObject* o, PyObject* unused) {
    ContextObject* self = (ContextObject*)o;
    if (self->handle == 0) Py_RETURN_NONE; // no Go side: no deadline
    if (check_fork() < 0) return NULL;
    double left = -1;
    int rc = dc_context_remaining(self->handle, &left);
    if (rc != DC_OK) return raise_rc(rc);
    if (left < 0) Py_RETURN_NONE;
    return PyFloat_FromDouble(left);
}

static PyMethodDef context_methods[] = {
    {"id", context_id, METH_NOARGS, "The request id."},
    {"is_stopped", context_is_stopped, METH_NOARGS, "True once stopped or killed (reads the state word)."},
    {"is_killed", context_is_killed, METH_NOARGS, "True once killed (reads the state word)."},
    {"stop_generating", context_stop_generating, METH_NOARGS, "Graceful stop; idempotent."},
    {"kill", context_kill, METH_NOARGS, "Hard abort; idempotent."},
    {"link_child", context_link_child, METH_O, "Make child follow this context."},
    {"child", context_child, METH_NOARGS, "New context with the same id, already linked."},
    {"remaining", context_remaining, METH_NOARGS, "Seconds to the deadline (0 once passed), or None without one."},
    {"_set_timeout", context_set_timeout, METH_O, "_set_timeout(seconds): kill with reason deadline that long from now."},
    {"_cancel", context_cancel, METH_VARARGS, "_cancel(state, reason): cancel with a given reason code."},
    {"_state_word", context_state_word, METH_NOARGS, "The raw state word (state | reason << 8)."},
    {"_handle", context_handle, METH_NOARGS, "The C ABI handle."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot context_slots[] = {
    {Py_tp_new, context_new},
    {Py_tp_dealloc, context_dealloc},
    {Py_tp_methods, context_methods},
    {Py_tp_doc, "Native base of dynamo_ctx.Context: one request's cancellation state."},
    {0, NULL},
};

static PyType_Spec context_spec = {
    "dynamo_ctx._native.Context",
    sizeof(ContextObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    context_slots,
};

// ---------------------------------------------------------------- module functions

static int parse_u64(PyObject* o, uint64_t* out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject* mod_queue_new(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int fd = -1;
    int rc = dc_queue_new(&h, &fd);
    if (rc != DC_OK) return raise_rc(rc);
    return Py_BuildValue("(Ki)", (unsigned long long)h, fd);
}

static PyObject* mod_queue_free(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_queue_free(h));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// append_tokens appends n tokens to the list out; -1 with an exception set.
static int append_tokens(PyObject* out, const uint64_t* toks, size_t n) {
    for (size_t i = 0; i < n; i++) {
        PyObject* v = PyLong_FromUnsignedLongLong(toks[i]);
        if (v == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return 0;
}

// drain_into appends what dc_queue_drain takes from queue h to out, until it
// takes nothing more; -1 with an exception set.
static int drain_into(uint64_t h, PyObject* out) {
    uint64_t buf[256];
    for (;;) {
        size_t n = 0;
        int rc = dc_queue_drain(h, buf, 256, &n);
        if (rc != DC_OK) {
            raise_rc(rc);
            return -1;
        }
        if (append_tokens(out, buf, n) < 0) return -1;
        if (n < 256) return 0;
    }
}

static PyObject* mod_queue_drain(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0) return NULL;
    if (check_fork() < 0) return NULL;
    PyObject* out = PyList_New(0);
    if (out == NULL) return NULL;
    if (drain_into(h, out) < 0) Py_CLEAR(out);
    return out;
}

// queue_drain_after(handle) -> bytes: dc_queue_drain_after, for queue_read.
static PyObject* mod_queue_drain_after(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    size_t bytes = 0;
    int rc = dc_queue_drain_after(h, &bytes);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromSize_t(bytes);
}

// queue_read(handle, fd, drain_after) -> list of tokens: what the event
// queue's pipe carries, read here without calling into Go (an event loop's
// wake-up then never waits for a Go P), oldest first; then, only when more
// than drain_after bytes were read (queue_drain_after: tokens may wait in the
// library because the pipe was full), what dc_queue_drain gives too.
static PyObject* mod_queue_read(PyObject* m, PyObject* args) {
    unsigned long long h;
    int fd;
    Py_ssize_t drain_after;
    if (!PyArg_ParseTuple(args, "Kin:queue_read", &h, &fd, &drain_after)) return NULL;
    if (check_fork() < 0) return NULL;
    PyObject* out = PyList_New(0);
    if (out == NULL) return NULL;
    uint64_t buf[512];
    size_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break; // empty
            PyErr_SetFromErrno(PyExc_OSError);
            Py_DECREF(out);
            return NULL;
        }
        if (r == 0) break; // the write end is closed: the queue was freed
        total += (size_t)r;
        if (append_tokens(out, buf, (size_t)r / 8) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if ((size_t)r < sizeof buf) break; // short: the pipe was emptied
    }
    if (total > 0 && (drain_after <= 0 || total > (size_t)drain_after) && drain_into(h, out) < 0) Py_CLEAR(out);
    return out;
}

static PyObject* mod_watch(PyObject* m, PyObject* args) {
    PyObject* ctx;
    unsigned long long q, token;
    unsigned int state;
    if (!PyArg_ParseTuple(args, "OKIK:watch", &ctx, &q, &state, &token)) return NULL;
    if (context_check(ctx) < 0) return NULL;
    if (materialize((ContextObject*)ctx) < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_context_watch(((ContextObject*)ctx)->handle, q, state, token));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_unwatch(PyObject* m, PyObject* args) {
    unsigned long long q, token;
    if (!PyArg_ParseTuple(args, "KK:unwatch", &q, &token)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_queue_unwatch(q, token));
    if (rc == DC_ENOENT) Py_RETURN_FALSE;
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_TRUE;
}

static PyObject* mod_handle_counts(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    uint64_t c = 0, q = 0, other = 0;
    int rc = dc_handle_counts(&c, &q, &other);
    if (rc != DC_OK) return raise_rc(rc);
    return Py_BuildValue("{sKsKsK}", "contexts", (unsigned long long)c, "queues", (unsigned long long)q,
                         "other", (unsigned long long)other);
}

static PyObject* mod_runtime_stats(PyObject* m, PyObject* args) {
    int collect = 0;
    if (!PyArg_ParseTuple(args, "|p:runtime_stats", &collect)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t g = 0, heap = 0;
    int rc;
    CALL_RELEASED(rc, dc_runtime_stats(collect, &g, &heap));
    if (rc != DC_OK) return raise_rc(rc);
    return Py_BuildValue("{sKsK}", "goroutines", (unsigned long long)g, "heap_bytes", (unsigned long long)heap);
}

static PyObject* mod_log_fd(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    int fd = -1;
    int rc = dc_log_fd(&fd);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromLong(fd);
}

static PyObject* mod_log_set_level(PyObject* m, PyObject* arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred()) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_log_set_level((int)level);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_log_drain(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    PyObject* out = PyList_New(0);
    if (out == NULL) return NULL;
    char small[1024];
    for (;;) {
        int level = 0;
        size_t n = 0;
        int rc = dc_log_next(&level, small, sizeof small, &n);
        PyObject* msg = NULL;
        if (rc == DC_EAGAIN) return out;
        if (rc == DC_OK) {
            msg = PyUnicode_DecodeUTF8(small, (Py_ssize_t)n, "replace");
        } else if (rc == DC_ERANGE) {
            char* big = PyMem_Malloc(n + 1);
            if (big == NULL) {
                Py_DECREF(out);
                return PyErr_NoMemory();
            }
            rc = dc_log_next(&level, big, n + 1, &n);
            if (rc == DC_OK) msg = PyUnicode_DecodeUTF8(big, (Py_ssize_t)n, "replace");
            PyMem_Free(big);
        }
        if (rc != DC_OK) {
            Py_DECREF(out);
            return raise_rc(rc);
        }
        if (msg == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject* item = Py_BuildValue("(iN)", level, msg);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
}

static PyObject* mod_selftest_panic(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    int rc = dc_selftest_panic();
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}


// ---------------------------------------------------------------- request plane
//
// Functions whose outcome the Python layer branches on (nothing ready, end of
// stream, a remote error) return (code, value) tuples; the Python layer owns
// the exception classes. Everything else raises.

// Calls a function of one handle that returns only a code.
static PyObject* call_h(PyObject* arg, int (*fn)(uint64_t), int release) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    if (release) {
        CALL_RELEASED(rc, fn(h));
    } else {
        rc = fn(h);
    }
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// Reads a string-valued property through a dc_*(h, buf, cap, &len) function.
static PyObject* get_bytes(uint64_t h, int (*fn)(uint64_t, char*, size_t, size_t*), int as_str) {
    char small[512];
    size_t n = 0;
    int rc = fn(h, small, sizeof small, &n);
    if (rc == DC_OK) {
        return as_str ? PyUnicode_DecodeUTF8(small, (Py_ssize_t)n, "strict")
                      : PyBytes_FromStringAndSize(small, (Py_ssize_t)n);
    }
    if (rc != DC_ERANGE) return raise_rc(rc);
    char* big = PyMem_Malloc(n + 1);
    if (big == NULL) return PyErr_NoMemory();
    rc = fn(h, big, n + 1, &n);
    PyObject* out = NULL;
    if (rc == DC_OK) {
        out = as_str ? PyUnicode_DecodeUTF8(big, (Py_ssize_t)n, "strict")
                     : PyBytes_FromStringAndSize(big, (Py_ssize_t)n);
    }
    PyMem_Free(big);
    if (rc != DC_OK) return raise_rc(rc);
    return out;
}

static PyObject* code_and_message(int rc) {
    char msg[1024];
    dc_last_error(msg, sizeof msg);
    return Py_BuildValue("(is)", rc, msg);
}

static PyObject* mod_runtime_new(PyObject* m, PyObject* args) {
    const char* url = NULL;
    Py_ssize_t url_len = 0;
    if (!PyArg_ParseTuple(args, "|z#:runtime_new", &url, &url_len)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_runtime_new((char*)url, (size_t)url_len, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_runtime_shutdown(PyObject* m, PyObject* arg) { return call_h(arg, dc_runtime_shutdown, 1); }
static PyObject* mod_runtime_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_runtime_free, 1); }
static PyObject* mod_runtime_drain(PyObject* m, PyObject* arg) { return call_h(arg, dc_runtime_drain, 1); }

static PyObject* mod_runtime_host_tick(PyObject* m, PyObject* arg) { return call_h(arg, dc_runtime_host_tick, 0); }

static PyObject* mod_runtime_active(PyObject* m, PyObject* arg) {
    uint64_t h, n = 0;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_runtime_active(h, &n);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject* mod_runtime_nats_url(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    return get_bytes(h, (int (*)(uint64_t, char*, size_t, size_t*))dc_runtime_nats_url, 1);
}

static PyObject* mod_endpoint_serve(PyObject* m, PyObject* args) {
    unsigned long long rt;
    const char *path, *meta = NULL;
    Py_ssize_t path_len, meta_len = 0;
    if (!PyArg_ParseTuple(args, "Ks#|z#:endpoint_serve", &rt, &path, &path_len, &meta, &meta_len)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_endpoint_serve(rt, (char*)path, (size_t)path_len, (char*)meta, (size_t)meta_len, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_endpoint_instance_id(PyObject* m, PyObject* arg) {
    uint64_t h, id = 0;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_endpoint_instance_id(h, &id);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(id);
}

static PyObject* mod_endpoint_accept(PyObject* m, PyObject* arg) {
    uint64_t h, req = 0;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_endpoint_accept(h, &req);
    if (rc == DC_OK) return Py_BuildValue("(iK)", rc, (unsigned long long)req);
    if (rc == DC_EAGAIN || rc == DC_ECLOSED) return Py_BuildValue("(iK)", rc, 0ULL);
    return raise_rc(rc);
}

static PyObject* mod_endpoint_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_endpoint_free, 1); }

static PyObject* mod_request_payload(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    return get_bytes(h, (int (*)(uint64_t, char*, size_t, size_t*))dc_request_payload, 0);
}

static PyObject* mod_request_metadata(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    return get_bytes(h, (int (*)(uint64_t, char*, size_t, size_t*))dc_request_metadata, 0);
}

// Wraps a context handle made by the library into an instance of cls (a
// subclass of the native Context type).
static PyObject* wrap_context_from(PyObject* args, int (*fn)(uint64_t, uint64_t*), const char* fmt) {
    unsigned long long h;
    PyObject* cls;
    if (!PyArg_ParseTuple(args, fmt, &h, &cls)) return NULL;
    if (check_fork() < 0) return NULL;
    int sub = PyObject_IsSubclass(cls, (PyObject*)ContextType);
    if (sub < 0) return NULL;
    if (!sub) {
        PyErr_SetString(PyExc_TypeError, "cls must be a subclass of the native Context");
        return NULL;
    }
    uint64_t ctx = 0;
    int rc = fn(h, &ctx);
    if (rc != DC_OK) return raise_rc(rc);
    return context_wrap((PyTypeObject*)cls, ctx);
}

static PyObject* mod_request_context(PyObject* m, PyObject* args) {
    return wrap_context_from(args, (int (*)(uint64_t, uint64_t*))dc_request_context, "KO:request_context");
}

static PyObject* mod_request_send(PyObject* m, PyObject* args) {
    unsigned long long h;
    const char* data;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Ky#:request_send", &h, &data, &len)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_request_send(h, (char*)data, (size_t)len);
    if (rc == DC_OK) Py_RETURN_TRUE;
    if (rc == DC_EAGAIN) Py_RETURN_FALSE;
    return raise_rc(rc);
}

// send_list queues the bytes in list for request h (dc_request_send_many),
// storing how many were taken in *sent. Returns the library's code, or -1
// with a Python exception set when list is not a list of bytes. Pointers
// into the bytes objects go to Go as they are: Go copies them before
// returning.
static int send_list(uint64_t h, PyObject* list, size_t* sent) {
    *sent = 0;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "items must be a list of bytes");
        return -1;
    }
    Py_ssize_t count = PyList_Size(list);
    if (count < 0) return -1;
    enum { SMALL = 64 };
    const char* small_items[SMALL];
    size_t small_lens[SMALL];
    const char** items = small_items;
    size_t* lens = small_lens;
    if (count > SMALL) {
        items = PyMem_Malloc((size_t)count * sizeof(char*));
        lens = PyMem_Malloc((size_t)count * sizeof(size_t));
        if (items == NULL || lens == NULL) {
            PyMem_Free((void*)items);
            PyMem_Free(lens);
            PyErr_NoMemory();
            return -1;
        }
    }
    int rc = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        char* p;
        Py_ssize_t n;
        PyObject* it = PyList_GetItem(list, i); // borrowed
        if (it == NULL || PyBytes_AsStringAndSize(it, &p, &n) < 0) goto done;
        items[i] = p;
        lens[i] = (size_t)n;
    }
    rc = dc_request_send_many(h, items, lens, (size_t)count, sent);
done:
    if (items != small_items) {
        PyMem_Free((void*)items);
        PyMem_Free(lens);
    }
    return rc;
}

// request_send_many(req, [bytes, ...]) -> how many were queued (fewer than
// given: the buffer is full; arm, then send the rest).
static PyObject* mod_request_send_many(PyObject* m, PyObject* args) {
    unsigned long long h;
    PyObject* list;
    if (!PyArg_ParseTuple(args, "KO:request_send_many", &h, &list)) return NULL;
    if (check_fork() < 0) return NULL;
    size_t sent = 0;
    int rc = send_list(h, list, &sent);
    if (rc == DC_OK || rc == DC_EAGAIN) return PyLong_FromSize_t(sent);
    if (rc == -1) return NULL;
    return raise_rc(rc);
}

// request_send_multi([req, ...], [[bytes, ...], ...]) -> [taken, ...]: the
// items of several requests in one call into the library
// (dc_request_send_multi), however many requests: the worker's loop hands
// over what every handler produced in one turn. Entry i is how many of
// batches[i] request reqs[i] took, or minus the library's error code for that
// request (the others are unaffected; sending to it again raises the error).
// A malformed argument raises before anything is queued.
static PyObject* mod_request_send_multi(PyObject* m, PyObject* args) {
    PyObject *reqs, *batches;
    if (!PyArg_ParseTuple(args, "O!O!:request_send_multi", &PyList_Type, &reqs, &PyList_Type, &batches)) return NULL;
    if (check_fork() < 0) return NULL;
    Py_ssize_t n = PyList_Size(reqs);
    if (PyList_Size(batches) != n) {
        PyErr_SetString(PyExc_ValueError, "request_send_multi: as many batches as requests");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* batch = PyList_GetItem(batches, i);
        if (!PyList_Check(batch)) {
            PyErr_SetString(PyExc_TypeError, "items must be a list of bytes");
            return NULL;
        }
        total += PyList_Size(batch);
    }
    // One allocation for the handles, counts, results and item pointers and
    // lengths; the pointers go to Go as they are (Go copies them before
    // returning, and the GIL is held throughout, so no list changes).
    size_t bytes = (size_t)n * (sizeof(uint64_t) + 2 * sizeof(size_t) + sizeof(int)) + (size_t)total * (sizeof(char*) + sizeof(size_t));
    char* mem = PyMem_Malloc(bytes ? bytes : 1);
    if (mem == NULL) return PyErr_NoMemory();
    uint64_t* hs = (uint64_t*)mem;
    size_t* counts = (size_t*)(hs + n);
    size_t* sent = counts + n;
    size_t* lens = sent + n;
    const char** items = (const char**)(lens + total);
    int* rcs = (int*)(items + total);
    PyObject* out = NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long h = PyLong_AsUnsignedLongLong(PyList_GetItem(reqs, i));
        if (h == (unsigned long long)-1 && PyErr_Occurred()) goto done;
        hs[i] = h;
        PyObject* batch = PyList_GetItem(batches, i);
        Py_ssize_t c = PyList_Size(batch);
        counts[i] = (size_t)c;
        for (Py_ssize_t j = 0; j < c; j++, k++) {
            char* p;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(PyList_GetItem(batch, j), &p, &len) < 0) goto done;
            items[k] = p;
            lens[k] = (size_t)len;
        }
    }
    // The library refuses a whole call of more than 65536 requests, of a
    // request of more than 65536 items, or of more than 2^24 items in all
    // (dc_request_send_multi): the requests cross in as many calls as that
    // takes, each within the bounds, so that the bound stays one per request
    // (dc_request_send_many's). A request of more items than that is refused
    // on its own, as dc_request_send_many refuses it.
    enum { CALL_REQUESTS = DC_SEND_MULTI_MAX_REQUESTS, REQUEST_ITEMS = DC_SEND_MANY_MAX, CALL_ITEMS = DC_SEND_MULTI_MAX_ITEMS };
    Py_ssize_t i0 = 0;
    size_t k0 = 0;
    while (i0 < n) {
        if (counts[i0] > REQUEST_ITEMS) {
            sent[i0] = 0;
            rcs[i0] = DC_EINVAL;
            k0 += counts[i0++];
            continue;
        }
        Py_ssize_t i1 = i0;
        size_t in_call = 0;
        while (i1 < n && i1 - i0 < CALL_REQUESTS && counts[i1] <= REQUEST_ITEMS && counts[i1] <= CALL_ITEMS - in_call) in_call += counts[i1++];
        int rc = dc_request_send_multi(hs + i0, counts + i0, (size_t)(i1 - i0), items + k0, lens + k0, sent + i0, rcs + i0);
        if (rc != DC_OK) {
            raise_rc(rc);
            goto done;
        }
        i0 = i1;
        k0 += in_call;
    }
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* v = (rcs[i] == DC_OK || rcs[i] == DC_EAGAIN) ? PyLong_FromSize_t(sent[i]) : PyLong_FromLong(-(long)rcs[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SetItem(out, i, v); // steals v (cannot fail: i is in range)
    }
done:
    PyMem_Free(mem);
    return out;
}

static PyObject* mod_request_complete(PyObject* m, PyObject* arg) { return call_h(arg, dc_request_complete, 0); }
static PyObject* mod_request_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_request_free, 0); }

static PyObject* mod_request_fail(PyObject* m, PyObject* args) {
    unsigned long long h;
    const char* msg;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Ks#:request_fail", &h, &msg, &len)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_request_fail(h, (char*)msg, (size_t)len);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_client_new(PyObject* m, PyObject* args) {
    unsigned long long rt;
    const char* path;
    Py_ssize_t path_len;
    if (!PyArg_ParseTuple(args, "Ks#:client_new", &rt, &path, &path_len)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_client_new(rt, (char*)path, (size_t)path_len, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_client_instances(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    uint64_t small[64];
    uint64_t* buf = small;
    size_t cap = 64, n = 0;
    int rc = dc_client_instances(h, buf, cap, &n);
    if (rc == DC_ERANGE) {
        cap = n + 16;
        buf = PyMem_Malloc(cap * sizeof(uint64_t));
        if (buf == NULL) return PyErr_NoMemory();
        rc = dc_client_instances(h, buf, cap, &n);
    }
    PyObject* out = NULL;
    if (rc == DC_OK && (out = PyList_New((Py_ssize_t)n)) != NULL) {
        for (size_t i = 0; i < n; i++) {
            PyObject* v = PyLong_FromUnsignedLongLong(buf[i]);
            if (v == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SetItem(out, (Py_ssize_t)i, v);
        }
    }
    if (buf != small) PyMem_Free(buf);
    if (rc != DC_OK) return raise_rc(rc);
    return out;
}

static PyObject* mod_client_generate(PyObject* m, PyObject* args) {
    unsigned long long h, instance = 0;
    const char* payload;
    Py_ssize_t len;
    PyObject* ctx = Py_None;
    int route = 0;
    const char* meta = NULL;
    Py_ssize_t meta_len = 0;
    if (!PyArg_ParseTuple(args, "Ky#|OiKz#:client_generate", &h, &payload, &len, &ctx, &route, &instance, &meta, &meta_len)) return NULL;
    uint64_t ctx_h = 0;
    if (ctx != Py_None) {
        if (context_check(ctx) < 0) return NULL;
        if (materialize((ContextObject*)ctx) < 0) return NULL;
        ctx_h = ((ContextObject*)ctx)->handle;
    }
    if (check_fork() < 0) return NULL;
    uint64_t s = 0;
    int rc;
    if (meta == NULL) {
        CALL_RELEASED(rc, dc_client_generate(h, (char*)payload, (size_t)len, ctx_h, route, instance, &s));
    } else {
        CALL_RELEASED(rc, dc_client_generate_metadata(h, (char*)payload, (size_t)len, (char*)meta, (size_t)meta_len, ctx_h, route, instance, &s));
    }
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(s);
}

static PyObject* mod_client_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_client_free, 1); }

static PyObject* mod_client_set_migration_limit(PyObject* m, PyObject* args) {
    unsigned long long h;
    int limit;
    if (!PyArg_ParseTuple(args, "Ki:client_set_migration_limit", &h, &limit)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_client_set_migration_limit(h, limit);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_stream_started(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_stream_started(h);
    if (rc == DC_EBADF || rc == DC_EINTERNAL) return raise_rc(rc);
    return code_and_message(rc);
}

// The items a take stored in buf: 4-byte little-endian length, then the bytes.
static uint32_t item_len(const char* p) {
    return (uint32_t)(unsigned char)p[0] | (uint32_t)(unsigned char)p[1] << 8 | (uint32_t)(unsigned char)p[2] << 16 |
           (uint32_t)(unsigned char)p[3] << 24;
}

// A list of bytes, one per item.
static PyObject* items_as_list(const char* buf, size_t used, size_t count) {
    PyObject* items = PyList_New((Py_ssize_t)count);
    size_t off = 0;
    for (size_t i = 0; items != NULL && i < count; i++) {
        uint32_t n = item_len(buf + off);
        PyObject* b = PyBytes_FromStringAndSize(buf + off + 4, (Py_ssize_t)n);
        if (b == NULL) {
            Py_CLEAR(items);
            break;
        }
        PyList_SetItem(items, (Py_ssize_t)i, b);
        off += 4 + (size_t)n;
    }
    return items;
}

// The text of one JSON array of the items: each item is a JSON value the
// library checked, so joined with commas inside brackets they are an array.
// At most used + 2 bytes ("[]" when nothing was taken).
static PyObject* items_as_json(const char* buf, size_t used, size_t count) {
    char* text = PyMem_Malloc(used + 2);
    if (text == NULL) return PyErr_NoMemory();
    size_t off = 0, w = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t n = item_len(buf + off);
        text[w++] = i == 0 ? '[' : ',';
        memcpy(text + w, buf + off + 4, n);
        w += n;
        off += 4 + (size_t)n;
    }
    if (count == 0) text[w++] = '[';
    text[w++] = ']';
    PyObject* str = PyUnicode_DecodeUTF8(text, (Py_ssize_t)w, NULL);
    PyMem_Free(text);
    return str;
}

// Takes what the stream has: (DC_OK, convert(items)) or (code, message).
static PyObject* stream_take_as(PyObject* arg, PyObject* (*convert)(const char*, size_t, size_t)) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    char small[16384];
    char* buf = small;
    size_t cap = sizeof small, used = 0, count = 0;
    int rc = dc_stream_take(h, buf, cap, &used, &count);
    if (rc == DC_ERANGE) {
        cap = used;
        buf = PyMem_Malloc(cap);
        if (buf == NULL) return PyErr_NoMemory();
        rc = dc_stream_take(h, buf, cap, &used, &count);
    }
    PyObject* out = NULL;
    if (rc == DC_OK) {
        PyObject* v = convert(buf, used, count);
        if (v != NULL) out = Py_BuildValue("(iN)", rc, v);
    } else if (rc == DC_EBADF || rc == DC_EINTERNAL || rc == DC_EINVAL) {
        raise_rc(rc);
    } else {
        out = code_and_message(rc);
    }
    if (buf != small) PyMem_Free(buf);
    return out;
}

// stream_take(s) -> (DC_OK, [bytes, ...]) or (code, message).
static PyObject* mod_stream_take(PyObject* m, PyObject* arg) { return stream_take_as(arg, items_as_list); }

// stream_take_json(s) -> (code, str): stream_take with the items as the text
// of one JSON array, ready for a single json.loads: no object per item.
static PyObject* mod_stream_take_json(PyObject* m, PyObject* arg) { return stream_take_as(arg, items_as_json); }

static PyObject* mod_stream_context(PyObject* m, PyObject* args) {
    return wrap_context_from(args, (int (*)(uint64_t, uint64_t*))dc_stream_context, "KO:stream_context");
}

static PyObject* mod_stream_kill(PyObject* m, PyObject* arg) { return call_h(arg, dc_stream_kill, 1); }
static PyObject* mod_stream_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_stream_free, 1); }

// --- encode_json: the common items, encoded without Python's encoder ------------
//
// A response item is encoded once per item on the worker's hottest path;
// Python's C encoder costs a call, a list of chunks and a join each time.
// This covers what items usually are (None, bools, ints, printable ASCII
// strings, and lists, tuples and str-keyed dicts of those) with exactly
// json.dumps(separators=(",", ":"))'s bytes, and answers None for anything
// else (floats, other strings, subclasses, deep nesting), which the caller
// then encodes with Python's encoder: the rules stay Python's.

typedef struct {
    char* p;
    size_t n, cap;
    char small[512];
} jbuf;

static int jb_put(jbuf* b, const char* s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->n + n) cap *= 2;
        char* p = b->p == b->small ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
        if (p == NULL) return -1;
        if (b->p == b->small) memcpy(p, b->small, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

// 1 encoded, 0 not handled here, -1 error (a Python exception is set).
static int jenc(jbuf* b, PyObject* o, int depth) {
    if (depth > 32) return 0;
    if (o == Py_None) return jb_put(b, "null", 4) < 0 ? -1 : 1;
    if (o == Py_True) return jb_put(b, "true", 4) < 0 ? -1 : 1;
    if (o == Py_False) return jb_put(b, "false", 5) < 0 ? -1 : 1;
    PyTypeObject* t = Py_TYPE(o);
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow != 0) return 0;
        if (v == -1 && PyErr_Occurred()) return -1;
        char num[24];
        int k = snprintf(num, sizeof num, "%lld", v);
        return jb_put(b, num, (size_t)k) < 0 ? -1 : 1;
    }
    if (t == &PyUnicode_Type) {
        Py_ssize_t len = PyUnicode_GetLength(o);
        if (len < 0) return -1;
        char chunk[128];
        size_t k = 0;
        if (jb_put(b, "\"", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < len; i++) {
            Py_UCS4 c = PyUnicode_ReadChar(o, i);
            if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return 0; // escaped by Python's rules
            chunk[k++] = (char)c;
            if (k == sizeof chunk) {
                if (jb_put(b, chunk, k) < 0) return -1;
                k = 0;
            }
        }
        if (jb_put(b, chunk, k) < 0 || jb_put(b, "\"", 1) < 0) return -1;
        return 1;
    }
    // Items, keys and values are borrowed: nothing here runs Python code, so
    // no container can change while it is encoded.
    if (t == &PyList_Type || t == &PyTuple_Type) {
        int list = t == &PyList_Type;
        Py_ssize_t len = list ? PyList_Size(o) : PyTuple_Size(o);
        if (len < 0 || jb_put(b, "[", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < len; i++) {
            if (i > 0 && jb_put(b, ",", 1) < 0) return -1;
            PyObject* item = list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);
            if (item == NULL) return -1;
            int r = jenc(b, item, depth + 1);
            if (r <= 0) return r;
        }
        return jb_put(b, "]", 1) < 0 ? -1 : 1;
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int first = 1;
        if (jb_put(b, "{", 1) < 0) return -1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type) return 0;
            if (!first && jb_put(b, ",", 1) < 0) return -1;
            first = 0;
            int r = jenc(b, k, depth + 1);
            if (r <= 0) return r;
            if (jb_put(b, ":", 1) < 0) return -1;
            r = jenc(b, v, depth + 1);
            if (r <= 0) return r;
        }
        return jb_put(b, "}", 1) < 0 ? -1 : 1;
    }
    return 0;
}

// encode_json(value) -> bytes, or None when Python's encoder must do it.
static PyObject* mod_encode_json(PyObject* m, PyObject* value) {
    jbuf b;
    b.p = b.small;
    b.n = 0;
    b.cap = sizeof b.small;
    int r = jenc(&b, value, 0);
    PyObject* out = NULL;
    if (r > 0) {
        out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
    } else if (r == 0) {
        out = Py_None;
        Py_INCREF(out);
    }
    if (b.p != b.small) PyMem_Free(b.p);
    return out;
}

extern uint64_t dc_kill_epoch; // errors.c

// kill_epoch() -> int: how many contexts this process has killed so far. A
// stream that stream_killed found not killed is still not killed while this
// has not changed since (read it before asking). Reads memory only.
static PyObject* mod_kill_epoch(PyObject* m, PyObject* unused) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&dc_kill_epoch, __ATOMIC_ACQUIRE));
}

static PyObject* mod_stream_killed(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int killed = 0;
    int rc = dc_stream_killed(h, &killed);
    if (rc != DC_OK) return raise_rc(rc);
    if (killed) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject* mod_frontend_start(PyObject* m, PyObject* args) {
    unsigned long long rt;
    const char *addr, *ns = NULL;
    Py_ssize_t addr_len, ns_len = 0;
    int limit = -1;
    if (!PyArg_ParseTuple(args, "Ks#|z#i:frontend_start", &rt, &addr, &addr_len, &ns, &ns_len, &limit)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_frontend_start(rt, (char*)addr, (size_t)addr_len, (char*)ns, (size_t)ns_len, limit, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_frontend_addr(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    return get_bytes(h, (int (*)(uint64_t, char*, size_t, size_t*))dc_frontend_addr, 1);
}

static PyObject* mod_frontend_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_frontend_free, 1); }

static PyObject* mod_frontend_drain(PyObject* m, PyObject* args) {
    unsigned long long h;
    double seconds;
    if (!PyArg_ParseTuple(args, "Kd:frontend_drain", &h, &seconds)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_frontend_drain((uint64_t)h, seconds));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_arm(PyObject* m, PyObject* args) {
    unsigned long long h, q, token;
    if (!PyArg_ParseTuple(args, "KKK:arm", &h, &q, &token)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_arm(h, q, token));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// Checks a path (whole=1) or one part of it (whole=0) by the library's one
// rule; ValueError with the library's message if it breaks it.
static PyObject* path_check(PyObject* arg, int whole) {
    if (check_fork() < 0) return NULL;
    PyObject* b = PyUnicode_AsUTF8String(arg);
    if (b == NULL) return NULL;
    char* s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &s, &n) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    int rc = whole ? dc_endpoint_path_check(s, (size_t)n) : dc_endpoint_name_check(s, (size_t)n);
    Py_DECREF(b);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_endpoint_path_check(PyObject* m, PyObject* arg) { return path_check(arg, 1); }
static PyObject* mod_endpoint_name_check(PyObject* m, PyObject* arg) { return path_check(arg, 0); }

static PyObject* mod_version(PyObject* m, PyObject* unused) {
    return PyUnicode_FromString(dc_version());
}

static PyMethodDef module_methods[] = {
    {"queue_new", mod_queue_new, METH_NOARGS, "queue_new() -> (handle, fd)"},
    {"queue_free", mod_queue_free, METH_O, "queue_free(handle)"},
    {"queue_drain", mod_queue_drain, METH_O, "queue_drain(handle) -> list of tokens"},
    {"queue_drain_after", mod_queue_drain_after, METH_O, "queue_drain_after(handle) -> bytes (see queue_read)"},
    {"queue_read", mod_queue_read, METH_VARARGS, "queue_read(handle, fd, drain_after) -> list of tokens, read from the fd"},
    {"watch", mod_watch, METH_VARARGS, "watch(context, queue, state, token)"},
    {"unwatch", mod_unwatch, METH_VARARGS, "unwatch(queue, token) -> bool (False if not pending)"},
    {"handle_counts", mod_handle_counts, METH_NOARGS, "handle_counts() -> {'contexts': n, 'queues': n}"},
    {"runtime_stats", mod_runtime_stats, METH_VARARGS, "runtime_stats(collect=False) -> {'goroutines': n, 'heap_bytes': n}"},
    {"log_fd", mod_log_fd, METH_NOARGS, "log_fd() -> fd readable when log records wait"},
    {"log_set_level", mod_log_set_level, METH_O, "log_set_level(python_level)"},
    {"log_drain", mod_log_drain, METH_NOARGS, "log_drain() -> list of (level, message)"},
    {"selftest_panic", mod_selftest_panic, METH_NOARGS, "Panic in Go on purpose; raises RuntimeError."},
    {"version", mod_version, METH_NOARGS, "The library version."},
    {"endpoint_path_check", mod_endpoint_path_check, METH_O, "endpoint_path_check(path): ValueError unless a valid namespace.component.endpoint"},
    {"endpoint_name_check", mod_endpoint_name_check, METH_O, "endpoint_name_check(name): ValueError unless a valid path part"},
    {"runtime_new", mod_runtime_new, METH_VARARGS, "runtime_new(nats_url=None) -> handle (blocks while connecting)"},
    {"runtime_shutdown", mod_runtime_shutdown, METH_O, "runtime_shutdown(rt)"},
    {"runtime_free", mod_runtime_free, METH_O, "runtime_free(rt)"},
    {"runtime_drain", mod_runtime_drain, METH_O, "runtime_drain(rt): leave discovery, serve what is in flight"},
    {"runtime_active", mod_runtime_active, METH_O, "runtime_active(rt) -> requests being served"},
    {"runtime_host_tick", mod_runtime_host_tick, METH_O, "runtime_host_tick(rt): the host is awake"},
    {"runtime_nats_url", mod_runtime_nats_url, METH_O, "runtime_nats_url(rt) -> str"},
    {"endpoint_serve", mod_endpoint_serve, METH_VARARGS, "endpoint_serve(rt, path, meta=None) -> handle"},
    {"endpoint_instance_id", mod_endpoint_instance_id, METH_O, "endpoint_instance_id(ep) -> int"},
    {"endpoint_accept", mod_endpoint_accept, METH_O, "endpoint_accept(ep) -> (code, request handle)"},
    {"endpoint_free", mod_endpoint_free, METH_O, "endpoint_free(ep)"},
    {"request_payload", mod_request_payload, METH_O, "request_payload(req) -> bytes"},
    {"request_metadata", mod_request_metadata, METH_O, "request_metadata(req) -> bytes (empty: none)"},
    {"request_context", mod_request_context, METH_VARARGS, "request_context(req, cls) -> Context"},
    {"request_send", mod_request_send, METH_VARARGS, "request_send(req, data) -> False if the buffer is full"},
    {"request_send_many", mod_request_send_many, METH_VARARGS, "request_send_many(req, [data, ...]) -> how many were queued"},
    {"request_send_multi", mod_request_send_multi, METH_VARARGS, "request_send_multi([req, ...], [[data, ...], ...]) -> [taken or -code, ...]"},
    {"request_complete", mod_request_complete, METH_O, "request_complete(req)"},
    {"request_fail", mod_request_fail, METH_VARARGS, "request_fail(req, message)"},
    {"request_free", mod_request_free, METH_O, "request_free(req)"},
    {"client_new", mod_client_new, METH_VARARGS, "client_new(rt, path) -> handle (blocks briefly)"},
    {"client_instances", mod_client_instances, METH_O, "client_instances(cl) -> list of ids"},
    {"client_generate", mod_client_generate, METH_VARARGS, "client_generate(cl, payload, ctx=None, route=0, instance=0, metadata=None) -> stream"},
    {"client_free", mod_client_free, METH_O, "client_free(cl)"},
    {"client_set_migration_limit", mod_client_set_migration_limit, METH_VARARGS, "client_set_migration_limit(cl, n)"},
    {"stream_started", mod_stream_started, METH_O, "stream_started(s) -> (code, message)"},
    {"stream_take", mod_stream_take, METH_O, "stream_take(s) -> (0, [bytes]) or (code, message)"},
    {"stream_context", mod_stream_context, METH_VARARGS, "stream_context(s, cls) -> Context"},
    {"stream_kill", mod_stream_kill, METH_O, "stream_kill(s)"},
    {"stream_take_json", mod_stream_take_json, METH_O, "stream_take_json(s) -> (code, '[item,...]' | message)"},
    {"stream_killed", mod_stream_killed, METH_O, "stream_killed(s) -> bool"},
    {"kill_epoch", mod_kill_epoch, METH_NOARGS, "kill_epoch() -> how many contexts were killed so far"},
    {"encode_json", mod_encode_json, METH_O, "encode_json(value) -> compact JSON bytes, or None: use Python's encoder"},
    {"stream_free", mod_stream_free, METH_O, "stream_free(s)"},
    {"frontend_start", mod_frontend_start, METH_VARARGS, "frontend_start(rt, addr, namespace=None, migration_limit=-1) -> handle"},
    {"frontend_addr", mod_frontend_addr, METH_O, "frontend_addr(fe) -> 'host:port'"},
    {"frontend_free", mod_frontend_free, METH_O, "frontend_free(fe)"},
    {"frontend_drain", mod_frontend_drain, METH_VARARGS, "frontend_drain(fe, seconds): stop accepting, finish, kill the rest"},
    {"arm", mod_arm, METH_VARARGS, "arm(handle, queue, token): push token when the object may have progressed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "dynamo_ctx._native",
    "Native core of dynamo_ctx (a Go c-shared library). Internal: use dynamo_ctx.", -1,
    module_methods,
};

static int add_int(PyObject* m, const char* name, long v) {
    return PyModule_AddIntConstant(m, name, v);
}

// The header's enums, each name written once: a module constant per name
// (without the DC_ prefix), and ERROR_NAMES {code: name} for the error codes.
#define DC_CONST(x) {#x, DC_##x}
static const struct { const char* name; long value; } error_codes[] = {
    DC_CONST(OK), DC_CONST(ENOENT), DC_CONST(EIO), DC_CONST(EBADF), DC_CONST(EAGAIN),
    DC_CONST(EEXIST), DC_CONST(EINVAL), DC_CONST(ERANGE), DC_CONST(EINTERNAL), DC_CONST(EOF),
    DC_CONST(EHANDLER), DC_CONST(EINCOMPLETE), DC_CONST(ENORESPONDERS), DC_CONST(ECLOSED),
    DC_CONST(ECONNECT),
}, other_constants[] = {
    DC_CONST(LIVE), DC_CONST(STOPPED), DC_CONST(KILLED),
    DC_CONST(REASON_STOP_GENERATING), DC_CONST(REASON_KILL), DC_CONST(REASON_CLIENT_DISCONNECTED),
    DC_CONST(REASON_PARENT), DC_CONST(REASON_DEADLINE), DC_CONST(REASON_CONNECTION_LOST),
    DC_CONST(REASON_SHUTDOWN),
    DC_CONST(ROUTE_ROUND_ROBIN), DC_CONST(ROUTE_RANDOM), DC_CONST(ROUTE_DIRECT),
    DC_CONST(HOST_TICK_MS),
};
#undef DC_CONST

// REASON_NAMES: the reasons' names by code as the library spells them (Go
// owns them: dc_reason_name), None at index 0 (live).
static PyObject* reason_names(void) {
    PyObject* t = PyTuple_New(DC_REASON_SHUTDOWN + 1);
    if (t == NULL) return NULL;
    Py_INCREF(Py_None);
    PyTuple_SetItem(t, 0, Py_None);
    for (uint32_t r = 1; r <= DC_REASON_SHUTDOWN; r++) {
        char buf[64];
        size_t n = 0;
        if (dc_reason_name(r, buf, sizeof buf, &n) != DC_OK) {
            Py_DECREF(t);
            PyErr_Format(PyExc_RuntimeError, "dynamo_ctx: the library has no name for reason %u", r);
            return NULL;
        }
        PyObject* name = PyUnicode_FromString(buf);
        if (name == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, r, name);
    }
    return t;
}

// The string facts Go owns (dc_string_constant), as module constants.
static const struct { const char* attr; const char* name; } string_constants[] = {
    {"HANDLER_ERROR_PREFIX", "handler_error_prefix"},
    {"NATS_ENV", "nats_env"},
    {"DEFAULT_NATS_URL", "nats_default_url"},
    {"KILL_TRACE_ENV", "kill_trace_env"},
};

static int add_string_constants(PyObject* m) {
    for (size_t i = 0; i < sizeof string_constants / sizeof string_constants[0]; i++) {
        char buf[512];
        size_t n = 0;
        if (dc_string_constant(string_constants[i].name, buf, sizeof buf, &n) != DC_OK) {
            PyErr_Format(PyExc_RuntimeError, "dynamo_ctx: the library has no constant %s", string_constants[i].name);
            return -1;
        }
        if (PyModule_AddStringConstant(m, string_constants[i].attr, buf) < 0) return -1;
    }
    return 0;
}

static int add_constants(PyObject* m) {
    size_t i;
    if (add_string_constants(m) < 0) return -1;
    for (i = 0; i < sizeof other_constants / sizeof other_constants[0]; i++)
        if (add_int(m, other_constants[i].name, other_constants[i].value) < 0) return -1;
    PyObject* names = PyDict_New();
    if (names == NULL) return -1;
    for (i = 0; i < sizeof error_codes / sizeof error_codes[0]; i++) {
        if (add_int(m, error_codes[i].name, error_codes[i].value) < 0) goto fail;
        PyObject* code = PyLong_FromLong(error_codes[i].value);
        PyObject* name = PyUnicode_FromString(error_codes[i].name);
        int bad = code == NULL || name == NULL || PyDict_SetItem(names, code, name) < 0;
        Py_XDECREF(code);
        Py_XDECREF(name);
        if (bad) goto fail;
    }
    if (PyModule_AddObject(m, "ERROR_NAMES", names) < 0) goto fail; // steals on success
    PyObject* reasons = reason_names();
    if (reasons == NULL) return -1;
    if (PyModule_AddObject(m, "REASON_NAMES", reasons) < 0) {
        Py_DECREF(reasons);
        return -1;
    }
    return 0;
fail:
    Py_DECREF(names);
    return -1;
}

PyMODINIT_FUNC PyInit__native(void) {
    PyObject* m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    ContextType = (PyTypeObject*)PyType_FromSpec(&context_spec);
    if (ContextType == NULL || PyModule_AddObject(m, "Context", (PyObject*)ContextType) < 0) {
        Py_XDECREF(ContextType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(ContextType); // one reference for the module, one for this file
    if (add_constants(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    dc_loaded_pid = getpid();
    pthread_atfork(NULL, NULL, dc_atfork_child);
    return m;
}

#endif // DC_WITH_PYTHON
