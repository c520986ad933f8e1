// py_trace.c: the host's spans (dc_trace_*): start one under a context's
// span, add events, end it; add an event to a context's span. While tracing
// is off each is a load of dc_trace_on, no call into Go.
#include "py_native.h"

#ifdef DC_WITH_PYTHON

static int trace_on(void) { return __atomic_load_n(&dc_trace_on, __ATOMIC_ACQUIRE) != 0; }

// trace_enabled() -> bool
static PyObject* mod_trace_enabled(PyObject* m, PyObject* unused) {
    if (trace_on()) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

// trace_span_start(ctx, name, attrs) -> span handle (0: not traced)
static PyObject* mod_trace_span_start(PyObject* m, PyObject* args) {
    unsigned long long ctx;
    const char *name, *attrs = NULL;
    Py_ssize_t name_len, attrs_len = 0;
    if (!PyArg_ParseTuple(args, "Ks#|z#:trace_span_start", &ctx, &name, &name_len, &attrs, &attrs_len)) return NULL;
    if (!trace_on()) return PyLong_FromLong(0);
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc = dc_trace_span_start(ctx, name, (size_t)name_len, attrs, (size_t)attrs_len, &h);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

// trace_span_event(span, name, attrs)
static PyObject* mod_trace_span_event(PyObject* m, PyObject* args) {
    unsigned long long h;
    const char *name, *attrs = NULL;
    Py_ssize_t name_len, attrs_len = 0;
    if (!PyArg_ParseTuple(args, "Ks#|z#:trace_span_event", &h, &name, &name_len, &attrs, &attrs_len)) return NULL;
    if (h == 0) Py_RETURN_NONE;  // not traced
    if (check_fork() < 0) return NULL;
    int rc = dc_trace_span_event(h, name, (size_t)name_len, attrs, (size_t)attrs_len);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// trace_span_end(span, attrs, failed=False)
static PyObject* mod_trace_span_end(PyObject* m, PyObject* args) {
    unsigned long long h;
    const char* attrs = NULL;
    Py_ssize_t attrs_len = 0;
    int failed = 0;
    if (!PyArg_ParseTuple(args, "K|z#p:trace_span_end", &h, &attrs, &attrs_len, &failed)) return NULL;
    if (h == 0) Py_RETURN_NONE;  // not traced
    if (check_fork() < 0) return NULL;
    int rc = dc_trace_span_end(h, attrs, (size_t)attrs_len, failed);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// trace_context_event(ctx, name, attrs)
static PyObject* mod_trace_context_event(PyObject* m, PyObject* args) {
    unsigned long long ctx;
    const char *name, *attrs = NULL;
    Py_ssize_t name_len, attrs_len = 0;
    if (!PyArg_ParseTuple(args, "Ks#|z#:trace_context_event", &ctx, &name, &name_len, &attrs, &attrs_len)) return NULL;
    if (!trace_on()) Py_RETURN_NONE;
    if (check_fork() < 0) return NULL;
    int rc = dc_trace_context_event(ctx, name, (size_t)name_len, attrs, (size_t)attrs_len);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

PyMethodDef trace_methods[] = {
    {"trace_enabled", mod_trace_enabled, METH_NOARGS, "trace_enabled() -> whether this process makes spans"},
    {"trace_span_start", mod_trace_span_start, METH_VARARGS,
     "trace_span_start(ctx, name, attrs=None) -> span handle, 0 when not traced"},
    {"trace_span_event", mod_trace_span_event, METH_VARARGS, "trace_span_event(span, name, attrs=None)"},
    {"trace_span_end", mod_trace_span_end, METH_VARARGS, "trace_span_end(span, attrs=None, failed=False)"},
    {"trace_context_event", mod_trace_context_event, METH_VARARGS, "trace_context_event(ctx, name, attrs=None)"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
