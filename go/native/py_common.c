// py_common.c: the helpers every part of the extension module calls: the
// fork guard, raising a library error as its Python exception, the flush
// after a cancel, handle arguments, and the calls of one handle and the
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
PyObject* raise_rc(int rc) {
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
PyObject* flush_local(void) {
    static PyObject* flush = NULL;
    if (python_function(&flush, "dynamo_ctx._aio", "_flush_local") == NULL) Py_RETURN_NONE; // the fd delivers it
    return PyObject_CallFunctionObjArgs(flush, NULL);
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

#endif // DC_WITH_PYTHON
