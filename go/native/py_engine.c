// py_engine.c: the engine-output reader of the extension module
// (dc_engine_outputs_*): the library reads a vLLM engine core's output
// stream, delivers routed requests' plain tokens itself and hands the host
// every message through a socket. What the Python layer branches on (a
// route not armed) is a return value; everything else raises. The routes'
// posted form is py_post.c's engine_outputs_post.
#include "py_native.h"

#ifdef DC_WITH_PYTHON
#include <string.h>

// engine_outputs_listen(path, message_layout, output_layout, suffix, window) -> (handle, fd): fd is the
// read end of the pipe that carries it the messages (the host's to read and close).
static PyObject* mod_engine_outputs_listen(PyObject* m, PyObject* args) {
    const char *path, *msg, *out;
    Py_ssize_t path_len, msg_len, out_len, suffix;
    double window;
    if (!PyArg_ParseTuple(args, "y#y#y#nd:engine_outputs_listen", &path, &path_len, &msg, &msg_len, &out, &out_len,
                          &suffix, &window))
        return NULL;
    if (suffix < 0) {
        PyErr_SetString(PyExc_ValueError, "engine_outputs_listen: suffix must not be negative");
        return NULL;
    }
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int fd = -1, rc;
    CALL_RELEASED(rc, dc_engine_outputs_listen(path, (size_t)path_len, msg, (size_t)msg_len, out, (size_t)out_len,
                                               (size_t)suffix, window, &h, &fd));
    if (rc != DC_OK) return raise_rc(rc);
    return Py_BuildValue("(Ki)", (unsigned long long)h, fd);
}

// A route change of reader h for one id, f (reserve or drop), its arguments
// parsed by format: None, or the error raised.
static PyObject* route_call(PyObject* args, const char* format, int (*f)(uint64_t, const char*, size_t)) {
    unsigned long long h;
    const char* id;
    Py_ssize_t id_len;
    if (!PyArg_ParseTuple(args, format, &h, &id, &id_len) || check_fork() < 0) return NULL;
    int rc = f((uint64_t)h, id, (size_t)id_len);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// engine_outputs_reserve(h, id)
static PyObject* mod_engine_outputs_reserve(PyObject* m, PyObject* args) {
    return route_call(args, "Ky#:engine_outputs_reserve", dc_engine_outputs_reserve);
}

// engine_outputs_activate(h, id, request) -> bool
static PyObject* mod_engine_outputs_activate(PyObject* m, PyObject* args) {
    unsigned long long h, req;
    const char* id;
    Py_ssize_t id_len;
    if (!PyArg_ParseTuple(args, "Ky#K:engine_outputs_activate", &h, &id, &id_len, &req) || check_fork() < 0)
        return NULL;
    int armed = 0;
    int rc = dc_engine_outputs_activate((uint64_t)h, id, (size_t)id_len, (uint64_t)req, &armed);
    if (rc != DC_OK) return raise_rc(rc);
    return PyBool_FromLong(armed);
}

// engine_outputs_drop(h, id)
static PyObject* mod_engine_outputs_drop(PyObject* m, PyObject* args) {
    return route_call(args, "Ky#:engine_outputs_drop", dc_engine_outputs_drop);
}

// engine_outputs_peers(h) -> engine connections past their handshake
static PyObject* mod_engine_outputs_peers(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int n = 0;
    int rc = dc_engine_outputs_peers(h, &n);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromLong(n);
}

// engine_outputs_sent(h) -> tokens the library delivered
static PyObject* mod_engine_outputs_sent(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int64_t n = 0;
    int rc = dc_engine_outputs_sent(h, &n);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromLongLong((long long)n);
}

static PyObject* mod_engine_outputs_free(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_engine_outputs_free(h));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// engine_inputs_listen(h, path, identity, abort_type): reader h takes the
// engine's input socket too (its ROUTER's path; the engine's routing id;
// the first frame of an abort).
static PyObject* mod_engine_inputs_listen(PyObject* m, PyObject* args) {
    unsigned long long h;
    const char *path, *identity, *abort_type;
    Py_ssize_t path_len, identity_len, abort_len;
    if (!PyArg_ParseTuple(args, "Ky#y#y#:engine_inputs_listen", &h, &path, &path_len, &identity, &identity_len,
                          &abort_type, &abort_len) ||
        check_fork() < 0)
        return NULL;
    int rc;
    CALL_RELEASED(rc, dc_engine_inputs_listen((uint64_t)h, path, (size_t)path_len, identity, (size_t)identity_len,
                                              abort_type, (size_t)abort_len));
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

// engine_inputs_abort(h, id): the engine aborts request id (its own id).
static PyObject* mod_engine_inputs_abort(PyObject* m, PyObject* args) {
    return route_call(args, "Ky#:engine_inputs_abort", dc_engine_inputs_abort);
}

// engine_inputs_peers(h) -> engine connections to the input socket past their handshake
static PyObject* mod_engine_inputs_peers(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int n = 0;
    int rc = dc_engine_inputs_peers(h, &n);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromLong(n);
}

// engine_inputs_aborts(h) -> aborts the library sent the engine
static PyObject* mod_engine_inputs_aborts(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int64_t n = 0;
    int rc = dc_engine_inputs_aborts(h, &n);
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromLongLong((long long)n);
}

DC_HIDDEN PyMethodDef engine_methods[] = {
    {"engine_inputs_listen", mod_engine_inputs_listen, METH_VARARGS,
     "engine_inputs_listen(handle, path, identity, abort_type)"},
    {"engine_inputs_abort", mod_engine_inputs_abort, METH_VARARGS, "engine_inputs_abort(handle, id)"},
    {"engine_inputs_peers", mod_engine_inputs_peers, METH_O, "engine_inputs_peers(handle) -> connections"},
    {"engine_inputs_aborts", mod_engine_inputs_aborts, METH_O, "engine_inputs_aborts(handle) -> aborts sent"},
    {"engine_outputs_listen", mod_engine_outputs_listen, METH_VARARGS,
     "engine_outputs_listen(path, message_layout, output_layout, suffix, window) -> (handle, fd)"},
    {"engine_outputs_reserve", mod_engine_outputs_reserve, METH_VARARGS, "engine_outputs_reserve(handle, id)"},
    {"engine_outputs_activate", mod_engine_outputs_activate, METH_VARARGS,
     "engine_outputs_activate(handle, id, request) -> armed"},
    {"engine_outputs_drop", mod_engine_outputs_drop, METH_VARARGS, "engine_outputs_drop(handle, id)"},
    {"engine_outputs_peers", mod_engine_outputs_peers, METH_O, "engine_outputs_peers(handle) -> connections"},
    {"engine_outputs_sent", mod_engine_outputs_sent, METH_O, "engine_outputs_sent(handle) -> tokens delivered"},
    {"engine_outputs_free", mod_engine_outputs_free, METH_O, "engine_outputs_free(handle)"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
