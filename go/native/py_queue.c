// py_queue.c: the event queues of the extension module (docs/architecture.md,
// Layers): making and freeing them, reading the tokens their fd carries
// (queue_read, without calling into Go), watches on contexts, dc_arm on the
// plane's objects; and the log queue's fd and records, which take the same
// road.
#include "py_native.h"

#ifdef DC_WITH_PYTHON
#include <errno.h>
#include <unistd.h>

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

// run_held(upto) -> int: dc_run_held, the wake-ups Context's cancels held
// with a ticket of at most upto (flush_local); how many cancels' it ran.
static PyObject* mod_run_held(PyObject* m, PyObject* arg) {
    uint64_t upto;
    if (parse_u64(arg, &upto) < 0 || check_fork() < 0) return NULL;
    int rc;
    size_t ran = 0;
    CALL_RELEASED(rc, dc_run_held(upto, &ran));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromSize_t(ran);
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

static PyObject* mod_arm(PyObject* m, PyObject* args) {
    unsigned long long h, q, token;
    if (!PyArg_ParseTuple(args, "KKK:arm", &h, &q, &token)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_arm(h, q, token));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

PyMethodDef queue_methods[] = {
    {"queue_new", mod_queue_new, METH_NOARGS, "queue_new() -> (handle, fd)"},
    {"queue_free", mod_queue_free, METH_O, "queue_free(handle)"},
    {"queue_drain", mod_queue_drain, METH_O, "queue_drain(handle) -> list of tokens"},
    {"queue_drain_after", mod_queue_drain_after, METH_O, "queue_drain_after(handle) -> bytes (see queue_read)"},
    {"run_held", mod_run_held, METH_O, "run_held(upto) -> int: run the wake-ups cancels held with a ticket of at most upto"},
    {"queue_read", mod_queue_read, METH_VARARGS, "queue_read(handle, fd, drain_after) -> list of tokens, read from the fd"},
    {"watch", mod_watch, METH_VARARGS, "watch(context, queue, state, token)"},
    {"unwatch", mod_unwatch, METH_VARARGS, "unwatch(queue, token) -> bool (False if not pending)"},
    {"arm", mod_arm, METH_VARARGS, "arm(handle, queue, token): push token when the object may have progressed"},
    {"log_fd", mod_log_fd, METH_NOARGS, "log_fd() -> fd readable when log records wait"},
    {"log_set_level", mod_log_set_level, METH_O, "log_set_level(python_level)"},
    {"log_drain", mod_log_drain, METH_NOARGS, "log_drain() -> list of (level, message)"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
