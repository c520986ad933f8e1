// py_context.c: the Context type of the extension module, the native base
// of dynamo_ctx.Context: creation (without the Go side until one is needed,
// see ContextObject in py_native.h), the state-word reads, cancellation,
// children, deadlines, and the wrapping of contexts the library made.
#include "py_native.h"

#ifdef DC_WITH_PYTHON

PyTypeObject* ContextType;

// Gives the context its Go side if it has none (see py_native.h).
int materialize(ContextObject* self) {
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
    if ((w & DC_STATE_MASK) != DC_LIVE) rc = dc_context_cancel(h, w & DC_STATE_MASK, (w >> DC_REASON_SHIFT) & DC_FIELD_MASK);
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

int context_check(PyObject* o) {
    int r = PyObject_IsInstance(o, (PyObject*)ContextType);
    if (r == 0) PyErr_SetString(PyExc_TypeError, "expected a dynamo_ctx.Context");
    return r == 1 ? 0 : -1;
}

// Checks an id by the library's one id rule (dc_id_check), now: the Go side
// that dc_context_new would check it on is made later. 0, or -1 with
// ValueError set, whose message states the rule. A str that is not UTF-8
// (lone surrogates) is checked as what "surrogatepass" encodes, which the
// rule refuses as invalid UTF-8.
static int check_id(PyObject* id) {
    PyObject* b = PyUnicode_AsUTF8String(id);
    if (b == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
        PyErr_Clear();
        b = PyUnicode_AsEncodedString(id, "utf-8", "surrogatepass");
        if (b == NULL) return -1;
    }
    char* s;
    Py_ssize_t n;
    int rc = -1;
    if (PyBytes_AsStringAndSize(b, &s, &n) == 0) {
        rc = dc_id_check(s, (size_t)n);
        if (rc != DC_OK) raise_rc(rc);
    }
    Py_DECREF(b);
    return rc == DC_OK ? 0 : -1;
}

static PyObject* context_new(PyTypeObject* tp, PyObject* args, PyObject* kwds) {
    static char* kwlist[] = {"id", NULL};
    PyObject* id = Py_None;
    Py_ssize_t nargs = PyTuple_Size(args);
    if (kwds == NULL && nargs == 1) {
        id = PyTuple_GetItem(args, 0); // Context(id), the common form: borrowed, no parsing
    } else if (kwds != NULL || nargs != 0) {
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
    if ((load_word((ContextObject*)o) & DC_STATE_MASK) >= DC_STOPPED) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject* context_is_killed(PyObject* o, PyObject* unused) {
    if ((load_word((ContextObject*)o) & DC_STATE_MASK) == DC_KILLED) Py_RETURN_TRUE;
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

static PyObject* context_cancel_with(PyObject* o, uint32_t state, uint32_t reason) {
    ContextObject* self = (ContextObject*)o;
    if (check_fork() < 0) return NULL;
    if (self->handle == 0) {
        // No Go side: nothing links to it, nothing awaits it, so only the
        // word changes, as the library's transition rule says
        // (dc_state_word_next; a stop after a kill changes nothing). Making
        // the Go side instead would cost several times more.
        uint32_t next = 0;
        int rc = dc_state_word_next(self->inline_word, state, reason, &next);
        if (rc != DC_OK) return raise_rc(rc);
        __atomic_store_n(&self->inline_word, next, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    int rc;
    uint64_t ticket = 0, q = 0;
    if (local_queue(&q) < 0) return NULL;
    if (q != 0) {
        // This thread's loop reads q: the tokens the cancel fires there come
        // back here, for the loop to deliver now without its fd.
        uint64_t toks[64];
        size_t n = 0;
        CALL_RELEASED(rc, dc_context_cancel_local(self->handle, state, reason, q, toks, 64, &n, &ticket));
        if (rc == DC_OK) return flush_local_tokens(ticket, q, toks, n);
        // DC_EBADF: q was freed meanwhile (its loop closed), or the context's
        // handle is bad, which the plain cancel reports.
        if (rc != DC_EBADF) return raise_rc(rc);
    }
    CALL_RELEASED(rc, dc_context_cancel_held(self->handle, state, reason, &ticket));
    if (rc != DC_OK) return raise_rc(rc);
    return flush_local(ticket);
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
    return flush_local(0); // a timeout of 0 kills at once
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
    {"_state_word", context_state_word, METH_NOARGS, "The raw state word (STATE_MASK, REASON_SHIFT, CAUSE_SHIFT give its layout)."},
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

// Wraps a context handle made by the library into an instance of cls (a
// subclass of the native Context type).
PyObject* wrap_context_from(PyObject* args, int (*fn)(uint64_t, uint64_t*), const char* fmt) {
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

int context_add_type(PyObject* m) {
    ContextType = (PyTypeObject*)PyType_FromSpec(&context_spec);
    if (ContextType == NULL || PyModule_AddObject(m, "Context", (PyObject*)ContextType) < 0) {
        Py_XDECREF(ContextType);
        return -1;
    }
    Py_INCREF(ContextType); // one reference for the module, one for this file
    return 0;
}

#endif // DC_WITH_PYTHON
