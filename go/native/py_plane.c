// py_plane.c: the serving side of the request plane in the extension
// module: runtimes, endpoints (and the checks of the endpoint path rule and
// the timeout rule), the requests a handler serves, and the HTTP frontend.
// Each wrapper converts its arguments, releases the GIL around a call that
// may block, and raises the library's error (py_client.c has the caller's
// side).
//
// Functions whose outcome the Python layer branches on (nothing ready, end of
// stream, a remote error) return (code, value) tuples; the Python layer owns
// the exception classes. Everything else raises.
#include "py_native.h"

#ifdef DC_WITH_PYTHON

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

// endpoint_set_engine_load(ep, waiting, kv_usage), the call (py_post.c's
// post_engine_load falls back to it).
PyObject* endpoint_set_engine_load_call(PyObject* m, PyObject* args) {
    unsigned long long h;
    long long waiting;
    double kv_usage;
    if (!PyArg_ParseTuple(args, "KLd:endpoint_set_engine_load", &h, &waiting, &kv_usage)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_endpoint_set_engine_load(h, (int64_t)waiting, kv_usage);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_endpoint_load(PyObject* m, PyObject* arg) {
    uint64_t h, refused = 0;
    int64_t running = 0, capacity = 0;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_endpoint_load(h, &running, &capacity, &refused);
    if (rc != DC_OK) return raise_rc(rc);
    return Py_BuildValue("(LLK)", (long long)running, (long long)capacity, (unsigned long long)refused);
}

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
    return send_multi_lists(reqs, batches);
}

// request_send_multi's work on its two lists (py_post.c calls it too).
PyObject* send_multi_lists(PyObject* reqs, PyObject* batches) {
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
    // The library refuses a whole call of more than DC_SEND_MULTI_MAX_REQUESTS
    // requests or DC_SEND_MULTI_MAX_ITEMS items in all (dc_request_send_multi):
    // the requests cross in as many calls as that takes, each call within
    // those bounds and holding at least one request, so that no request is
    // refused for what the others hold. (A request of more items than one
    // request may hold is the library's to refuse, on its own.)
    enum { CALL_REQUESTS = DC_SEND_MULTI_MAX_REQUESTS, CALL_ITEMS = DC_SEND_MULTI_MAX_ITEMS };
    Py_ssize_t i0 = 0;
    size_t k0 = 0;
    while (i0 < n) {
        Py_ssize_t i1 = i0 + 1;
        size_t in_call = counts[i0];
        while (i1 < n && i1 - i0 < CALL_REQUESTS && in_call <= CALL_ITEMS && counts[i1] <= CALL_ITEMS - in_call) in_call += counts[i1++];
        int rc = dc_request_send_multi(hs + i0, counts + i0, (size_t)(i1 - i0), items + k0, lens + k0, sent + i0, rcs + i0);
        if (rc != DC_OK) {
            if (i0 == 0) {
                raise_rc(rc); // the first call: nothing of this one was queued but what a recovered panic left
                goto done;
            }
            // The earlier calls' items are queued: their answers stand, and
            // the requests of this call and after answer its error (the
            // loop would send the earlier ones again if this raised).
            for (Py_ssize_t i = i0; i < n; i++) {
                sent[i] = 0;
                rcs[i] = rc;
            }
            break;
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

// The frontend's settings are one JSON text (dc_frontend_start): a str,
// passed on as its UTF-8.
static PyObject* mod_frontend_start(PyObject* m, PyObject* args) {
    unsigned long long rt;
    const char* settings;
    Py_ssize_t settings_len;
    if (!PyArg_ParseTuple(args, "Ks#:frontend_start", &rt, &settings, &settings_len)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_frontend_start(rt, (char*)settings, (size_t)settings_len, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_frontend_check_settings(PyObject* m, PyObject* args) {
    const char* settings;
    Py_ssize_t settings_len;
    if (!PyArg_ParseTuple(args, "s#:frontend_check_settings", &settings, &settings_len)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_frontend_check_settings((char*)settings, (size_t)settings_len);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
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

// Checks a timeout in seconds by the library's one rule; ValueError with
// the library's message if it breaks it.
static PyObject* mod_timeout_check(PyObject* m, PyObject* arg) {
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_timeout_check(seconds);
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

PyMethodDef plane_methods[] = {
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
    {"endpoint_set_engine_load", endpoint_set_engine_load_call, METH_VARARGS,
     "endpoint_set_engine_load(ep, waiting, kv_usage): the engine's figures for the load reports (negative: left out)"},
    {"endpoint_load", mod_endpoint_load, METH_O, "endpoint_load(ep) -> (running, capacity, refused as busy)"},
    {"request_payload", mod_request_payload, METH_O, "request_payload(req) -> bytes"},
    {"request_metadata", mod_request_metadata, METH_O, "request_metadata(req) -> bytes (empty: none)"},
    {"request_context", mod_request_context, METH_VARARGS, "request_context(req, cls) -> Context"},
    {"request_send", mod_request_send, METH_VARARGS, "request_send(req, data) -> False if the buffer is full"},
    {"request_send_many", mod_request_send_many, METH_VARARGS, "request_send_many(req, [data, ...]) -> how many were queued"},
    {"request_send_multi", mod_request_send_multi, METH_VARARGS, "request_send_multi([req, ...], [[data, ...], ...]) -> [taken or -code, ...]"},
    {"request_complete", mod_request_complete, METH_O, "request_complete(req)"},
    {"request_fail", mod_request_fail, METH_VARARGS, "request_fail(req, message)"},
    {"request_free", mod_request_free, METH_O, "request_free(req)"},
    {"timeout_check", mod_timeout_check, METH_O, "timeout_check(seconds): ValueError unless a timeout the library takes"},
    {"frontend_start", mod_frontend_start, METH_VARARGS, "frontend_start(rt, settings_json) -> handle"},
    {"frontend_check_settings", mod_frontend_check_settings, METH_VARARGS, "frontend_check_settings(settings_json) -> None; ValueError for a bad setting"},
    {"frontend_addr", mod_frontend_addr, METH_O, "frontend_addr(fe) -> 'host:port'"},
    {"frontend_free", mod_frontend_free, METH_O, "frontend_free(fe)"},
    {"frontend_drain", mod_frontend_drain, METH_VARARGS, "frontend_drain(fe, seconds): stop accepting, finish, kill the rest"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
