// py_status.c: the status listener of the extension module (dc_status_*):
// starting and freeing it, taking the requests it queues for the host and
// handing back the host's answers. Like py_plane.c, what the Python layer
// branches on (nothing waits, closed, an answer no longer awaited) is a
// return value; everything else raises.
#include "py_native.h"

#ifdef DC_WITH_PYTHON

// status_start(fd, paths, read_timeout=0, max_connections=0, answer_timeout=0) -> handle
static PyObject* mod_status_start(PyObject* m, PyObject* args) {
    int fd;
    const char* paths;
    Py_ssize_t paths_len;
    double read_timeout = 0, answer_timeout = 0;
    int max_connections = 0;
    if (!PyArg_ParseTuple(args, "is#|did:status_start", &fd, &paths, &paths_len, &read_timeout, &max_connections,
                          &answer_timeout))
        return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_status_start(fd, paths, (size_t)paths_len, read_timeout, max_connections, answer_timeout, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_status_addr(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    return get_bytes(h, dc_status_addr, 1);
}

// status_next(h) -> (code, id, path): (OK, id, path), or (EAGAIN or
// ECLOSED, 0, None).
static PyObject* mod_status_next(PyObject* m, PyObject* arg) {
    uint64_t h, id = 0;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    char path[DC_STATUS_PATH_MAX];
    size_t n = 0;
    int rc = dc_status_next(h, &id, path, sizeof path, &n);
    if (rc == DC_OK) return Py_BuildValue("(iKs#)", rc, (unsigned long long)id, path, (Py_ssize_t)n);
    if (rc == DC_EAGAIN || rc == DC_ECLOSED) return Py_BuildValue("(iKO)", rc, 0ULL, Py_None);
    return raise_rc(rc);
}

// status_answer(h, id, code, content_type, body) -> bool: False when the
// request no longer waits (or the listener closed).
static PyObject* mod_status_answer(PyObject* m, PyObject* args) {
    unsigned long long h, id;
    int code;
    const char *ctype, *body;
    Py_ssize_t ctype_len, body_len;
    if (!PyArg_ParseTuple(args, "KKis#y#:status_answer", &h, &id, &code, &ctype, &ctype_len, &body, &body_len)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc;
    CALL_RELEASED(rc, dc_status_answer(h, id, code, ctype, (size_t)ctype_len, body, (size_t)body_len));
    if (rc == DC_ENOENT || rc == DC_ECLOSED) Py_RETURN_FALSE;
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_TRUE;
}

static PyObject* mod_status_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_status_free, 1); }

PyMethodDef status_methods[] = {
    {"status_start", mod_status_start, METH_VARARGS,
     "status_start(fd, paths, read_timeout=0, max_connections=0, answer_timeout=0) -> handle"},
    {"status_addr", mod_status_addr, METH_O, "status_addr(h) -> 'host:port'"},
    {"status_next", mod_status_next, METH_O, "status_next(h) -> (code, id, path)"},
    {"status_answer", mod_status_answer, METH_VARARGS,
     "status_answer(h, id, code, content_type, body) -> False if the request no longer waits"},
    {"status_free", mod_status_free, METH_O, "status_free(h): close the listener"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
