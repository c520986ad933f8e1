// py_module.c: the extension module dynamo_ctx._native itself: its
// definition and PyInit__native, which adds the functions of each py_*.c
// file and the Context type; the module's constants (the header's enums,
// the reasons' names, the string facts Go owns); and the diagnostics (the
// panic self-test only in the test library, built with -tags dc_selftest).
#include "py_native.h"

#ifdef DC_WITH_PYTHON

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

#ifdef DC_SELFTEST
// The test library's alone (go/native/selftest_exports.go): the public header
// does not declare it.
int dc_selftest_panic(void);

static PyObject* mod_selftest_panic(PyObject* m, PyObject* unused) {
    if (check_fork() < 0) return NULL;
    int rc = dc_selftest_panic();
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}
#endif

static PyObject* mod_version(PyObject* m, PyObject* unused) {
    return PyUnicode_FromString(dc_version());
}

static PyMethodDef module_methods[] = {
    {"handle_counts", mod_handle_counts, METH_NOARGS, "handle_counts() -> {'contexts': n, 'queues': n}"},
    {"runtime_stats", mod_runtime_stats, METH_VARARGS, "runtime_stats(collect=False) -> {'goroutines': n, 'heap_bytes': n}"},
#ifdef DC_SELFTEST
    {"selftest_panic", mod_selftest_panic, METH_NOARGS, "Panic in Go on purpose; raises RuntimeError (test library only)."},
#endif
    {"version", mod_version, METH_NOARGS, "The library version."},
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
    DC_CONST(STATE_MASK), DC_CONST(REASON_SHIFT), DC_CONST(CAUSE_SHIFT), DC_CONST(FIELD_MASK),
    DC_CONST(REASON_STOP_GENERATING), DC_CONST(REASON_KILL), DC_CONST(REASON_CLIENT_DISCONNECTED),
    DC_CONST(REASON_PARENT), DC_CONST(REASON_DEADLINE), DC_CONST(REASON_CONNECTION_LOST),
    DC_CONST(REASON_SHUTDOWN),
    DC_CONST(ROUTE_ROUND_ROBIN), DC_CONST(ROUTE_RANDOM), DC_CONST(ROUTE_DIRECT),
    DC_CONST(HOST_TICK_MS), DC_CONST(MAX_ID_LEN), DC_CONST(MAX_TIMEOUT_SECONDS), DC_CONST(POST_MAX_MESSAGE),
    DC_CONST(MODEL_CARD_MAX_BYTES), DC_CONST(MODEL_MAX_TOKENIZER_BYTES), DC_CONST(MODEL_MAX_CONFIG_BYTES),
};
#undef DC_CONST

// REASON_NAMES: the reasons' names by code as the library spells them (Go
// owns them: dc_reason_name), None at index 0 (live); DC_REASON_COUNT codes.
static PyObject* reason_names(void) {
    PyObject* t = PyTuple_New(DC_REASON_COUNT);
    if (t == NULL) return NULL;
    Py_INCREF(Py_None);
    PyTuple_SetItem(t, 0, Py_None);
    for (uint32_t r = 1; r < DC_REASON_COUNT; r++) {
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
    {"BASE_PARAMS", "base_params"},
    {"ENGINE_PARAMS", "engine_params"},
    {"TOOL_CALL_PARSERS", "tool_call_parsers"},
    {"REASONING_PARSERS", "reasoning_parsers"},
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
    PyMethodDef* parts[] = {common_methods, queue_methods, plane_methods, client_methods, json_methods, status_methods,
                            model_methods, trace_methods, post_methods, engine_methods};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (PyModule_AddFunctions(m, parts[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (context_add_type(m) < 0 || add_constants(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    fork_guard_install();
    return m;
}

#endif // DC_WITH_PYTHON
