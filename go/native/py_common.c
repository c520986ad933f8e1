// py_common.c: the helpers every part of the extension module calls: the
// fork guard, the Python callbacks the package registers (the exception
// for a library error, the flush after a cancel), handle arguments, and the calls of one handle and the
// string getters the wrappers share (declared in py_native.h).
#include "py_native.h"

#ifdef DC_WITH_PYTHON
#include <pthread.h>
#include <unistd.h>

volatile int dc_forked = 0;
static pid_t dc_loaded_pid = 0;
static void dc_atfork_child(void) { dc_forked = 1; }

void fork_guard_install(void) {
    dc_loaded_pid = getpid();
    pthread_atfork(NULL, NULL, dc_atfork_child);
}

int check_fork(void) {
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

// The Python functions the package registers when it loads the module
// (_register_callbacks, called by dynamo_ctx._lib): C imports no Python
// module. NULL until then; the module keeps them alive.
static PyObject* exception_for_cb = NULL; // (code, message) -> exception: dynamo_ctx.errors._exception_for
static PyObject* flush_local_cb = NULL;   // (ticket[, tokens, q]) -> None/bool: dynamo_ctx._aio._flush_local
static PyObject* local_queue_cb = NULL;   // () -> int: dynamo_ctx._aio._local_queue; NULL: none

// _register_callbacks(exception_for, flush_local, local_queue=None): see the
// three above. Each given must be callable; a later call replaces them all
// (a missing local_queue: cancels leave their tokens to the fd).
static PyObject* mod_register_callbacks(PyObject* m, PyObject* args, PyObject* kwds) {
    static char* kwlist[] = {"exception_for", "flush_local", "local_queue", NULL};
    PyObject *exception_for, *flush, *local = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O:_register_callbacks", kwlist, &exception_for, &flush, &local)) return NULL;
    if (!PyCallable_Check(exception_for) || !PyCallable_Check(flush) || (local != Py_None && !PyCallable_Check(local))) {
        PyErr_SetString(PyExc_TypeError, "_register_callbacks: exception_for, flush_local and local_queue must be callable");
        return NULL;
    }
    PyObject *old_exception_for = exception_for_cb, *old_flush = flush_local_cb, *old_local = local_queue_cb;
    Py_INCREF(exception_for);
    Py_INCREF(flush);
    exception_for_cb = exception_for;
    flush_local_cb = flush;
    local_queue_cb = NULL;
    if (local != Py_None) {
        Py_INCREF(local);
        local_queue_cb = local;
    }
    Py_XDECREF(old_exception_for);
    Py_XDECREF(old_flush);
    Py_XDECREF(old_local);
    Py_RETURN_NONE;
}

// Raises the exception for error code rc with the calling thread's last error
// message. Which exception is Python's business: the one table is
// dynamo_ctx.errors._exception_for(code, message), registered at load;
// before that, RuntimeError with the message.
PyObject* raise_rc(int rc) {
    char msg[DC_ERROR_MESSAGE_MAX];
    dc_last_error(msg, sizeof msg);
    PyObject* table = exception_for_cb;
    if (table == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s (code %d)", msg, rc);
        return NULL;
    }
    Py_INCREF(table); // a call may register others meanwhile
    PyObject* exc = PyObject_CallFunction(table, "is", rc, msg);
    Py_DECREF(table);
    if (exc == NULL) return NULL; // the table itself raised
    PyObject* type = PyObject_Type(exc);
    PyErr_SetObject(type, exc);
    Py_DECREF(type);
    Py_DECREF(exc);
    return NULL;
}

// After this thread cancelled a context: the registered flush_local
// (dynamo_ctx._aio._flush_local) delivers at once what the cancellation woke
// on this thread's running event loop (an in-process handler, a waiter),
// rather than after the loop's next poll of its fd; a non-zero ticket (the
// cancel held wake-ups: dc_context_cancel_held) tells it to have them run
// (dc_run_held) on the loop's next turn, or now without a loop. It returns
// None and never raises. Before registration there is nothing to flush (the
// fd delivers it), and held wake-ups run here.
PyObject* flush_local(uint64_t ticket) {
    PyObject* flush = flush_local_cb;
    if (flush == NULL) {
        if (ticket != 0) dc_run_held(ticket, NULL);
        Py_RETURN_NONE;
    }
    PyObject* t = PyLong_FromUnsignedLongLong(ticket);
    if (t == NULL) {
        if (ticket != 0) dc_run_held(ticket, NULL);
        return NULL;
    }
    Py_INCREF(flush);
    PyObject* r = PyObject_CallFunctionObjArgs(flush, t, NULL);
    Py_DECREF(flush);
    Py_DECREF(t);
    return r;
}

int local_queue(uint64_t* q) {
    *q = 0;
    PyObject* f = local_queue_cb;
    if (f == NULL) return 0;
    Py_INCREF(f); // a call may register others meanwhile
    PyObject* r = PyObject_CallObject(f, NULL);
    Py_DECREF(f);
    if (r != NULL) {
        *q = PyLong_AsUnsignedLongLong(r);
        Py_DECREF(r);
    }
    if (PyErr_Occurred()) {
        *q = 0;
        // A KeyboardInterrupt (a signal's handler ran meanwhile) goes to the
        // caller; any other error loses only a speed-up: the cancel leaves
        // its tokens to the fd.
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
        PyErr_Clear();
    }
    return 0;
}

// give_back hands toks to queue q's fd, and runs the held wake-ups of ticket:
// for tokens the flush could not deliver. Keeps the exception set, if any.
static void give_back(uint64_t ticket, uint64_t q, const uint64_t* toks, size_t n) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    dc_queue_push(q, toks, n);
    if (ticket != 0) dc_run_held(ticket, NULL); // nothing else would run them before a call that waits
    PyErr_Restore(type, value, tb);
}

PyObject* flush_local_tokens(uint64_t ticket, uint64_t q, const uint64_t* toks, size_t n) {
    PyObject* flush = flush_local_cb;
    Py_XINCREF(flush); // allocating below may run code that registers others
    PyObject* list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject* v = PyLong_FromUnsignedLongLong(toks[i]);
        if (v == NULL || PyList_SetItem(list, (Py_ssize_t)i, v) < 0) Py_CLEAR(list); // SetItem steals v
    }
    PyObject* t = list == NULL ? NULL : PyLong_FromUnsignedLongLong(ticket);
    PyObject* qo = t == NULL ? NULL : PyLong_FromUnsignedLongLong(q);
    PyObject* r = NULL;
    if (flush != NULL && qo != NULL) r = PyObject_CallFunctionObjArgs(flush, t, list, qo, NULL);
    Py_XDECREF(flush);
    Py_XDECREF(list);
    Py_XDECREF(t);
    Py_XDECREF(qo);
    // The flush returns False when it found no waker of q to deliver to; it
    // fails only before delivering (the package's catches what delivering
    // raises), or it was not called (out of memory, or unregistered since).
    // Then the fd delivers the tokens: one delivered twice finds nothing
    // waiting on it the second time.
    if (r == NULL || r == Py_False) give_back(ticket, q, toks, n);
    if (r == Py_False) {
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    if (r == NULL && !PyErr_Occurred()) Py_RETURN_NONE; // unregistered: nothing failed
    return r;
}

int parse_u64(PyObject* o, uint64_t* out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)v;
    return 0;
}

// Calls a function of one handle that returns only a code.
PyObject* call_h(PyObject* arg, int (*fn)(uint64_t), int release) {
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
PyObject* get_bytes(uint64_t h, int (*fn)(uint64_t, char*, size_t, size_t*), int as_str) {
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

PyMethodDef common_methods[] = {
    {"_register_callbacks", (PyCFunction)(void (*)(void))mod_register_callbacks, METH_VARARGS | METH_KEYWORDS,
     "_register_callbacks(exception_for, flush_local): the package's functions the module calls"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
