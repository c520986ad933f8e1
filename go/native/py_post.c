// py_post.c: the calls the worker's loop makes at every engine step or on a
// timer, posted to the library without a call into it (dc_post_fd; why, and
// the messages' format: go/native/posted.go). Each falls back to the call
// when posting is off or the socket refuses the message, so that nothing is
// lost and the order holds: a call runs what was posted before it first.
#include "py_native.h"

#ifdef DC_WITH_PYTHON

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/socket.h>

#include "posted.h" // what the library shares with this file in memory

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the posted messages are little-endian (posted.go)");

enum { KIND_ITEMS = 1, KIND_HOST_TICK = 2, KIND_ENGINE_LOAD = 3, KIND_ENGINE_RESERVE = 4, KIND_ENGINE_ACTIVATE = 5, KIND_ENGINE_DROP = 6,
       KIND_ENGINE_INPUT = 7 };

// The post socket's fd: -2 not asked yet, -1 none (posting off).
static int post_fd = -2;

static int post_socket(void) {
    if (post_fd == -2) {
        int fd = -1;
        post_fd = dc_post_fd(&fd) == DC_OK ? fd : -1;
    }
    return post_fd;
}

// Whether the library has run all but DC_POSTED_MAX_AHEAD of the messages
// posted: else the host makes the call (posted.h).
static int post_ahead_ok(void) {
    uint64_t done = __atomic_load_n(&dc_posted_done, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&dc_posted_sent, __ATOMIC_SEQ_CST) - done < DC_POSTED_MAX_AHEAD;
}

// Writes one message; 0 if it went, -1 if it did not (nothing is raised: the
// caller makes the call instead). The GIL is held: the write never blocks.
static int post(const char* msg, size_t len) {
    int fd = post_socket();
    if (fd < 0 || __atomic_load_n(&dc_posted_over, __ATOMIC_SEQ_CST) == DC_POSTED_BROKEN || !post_ahead_ok()) return -1;
    __atomic_add_fetch(&dc_posted_sent, 1, __ATOMIC_SEQ_CST); // before the write: see posted.c
    ssize_t w;
    do {
        w = send(fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (w < 0 && errno == EINTR);
    if (w != (ssize_t)len) {
        __atomic_sub_fetch(&dc_posted_sent, 1, __ATOMIC_SEQ_CST);
        return -1;
    }
    return 0;
}

static void put_u32(char* p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(char* p, uint64_t v) { memcpy(p, &v, 8); }

// The size of a request's record (batch: its items) in a message of items;
// 0 if they are not what request_send_multi takes (it then raises).
static size_t record_size(PyObject* batch) {
    if (!PyList_Check(batch)) return 0;
    size_t size = 12;
    Py_ssize_t c = PyList_Size(batch);
    if ((size_t)c > DC_SEND_MANY_MAX) return 0;
    for (Py_ssize_t j = 0; j < c; j++) {
        PyObject* it = PyList_GetItem(batch, j);
        if (!PyBytes_Check(it)) return 0;
        size += 4 + (size_t)PyBytes_Size(it);
    }
    return size;
}

// Writes request h's record at p (its handle, its count, its items) and
// returns where it ends.
static char* put_record(char* p, uint64_t h, PyObject* batch) {
    Py_ssize_t c = PyList_Size(batch);
    put_u64(p, h);
    put_u32(p + 8, (uint32_t)c);
    p += 12;
    for (Py_ssize_t j = 0; j < c; j++) {
        PyObject* it = PyList_GetItem(batch, j);
        Py_ssize_t len = PyBytes_Size(it);
        put_u32(p, (uint32_t)len);
        memcpy(p + 4, PyBytes_AsString(it), (size_t)len);
        p += 4 + len;
    }
    return p;
}

// Whether request h is listed as full (dc_posted_full): its items go by the
// call, whose answers refuse them while it is.
static int listed_full(uint64_t h) {
    for (int i = 0; i < DC_POSTED_FULL_SLOTS; i++)
        if (__atomic_load_n(&dc_posted_full[i], __ATOMIC_SEQ_CST) == h) return 1;
    return 0;
}

// The call for the requests marked in by_call, its answers stored into out
// at their places; -1 with the call's exception.
static int call_marked(PyObject* reqs, PyObject* batches, const char* by_call, PyObject* out) {
    Py_ssize_t n = PyList_Size(reqs), k = 0;
    PyObject* r = PyList_New(0);
    PyObject* b = PyList_New(0);
    PyObject* taken = NULL;
    if (r == NULL || b == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        if (by_call[i] && (PyList_Append(r, PyList_GetItem(reqs, i)) < 0 || PyList_Append(b, PyList_GetItem(batches, i)) < 0))
            goto done;
    taken = send_multi_lists(r, b);
    if (taken == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!by_call[i]) continue;
        PyObject* v = PyList_GetItem(taken, k++);
        Py_INCREF(v);
        PyList_SetItem(out, i, v); // steals v
    }
done:
    Py_XDECREF(r);
    Py_XDECREF(b);
    if (taken == NULL) return -1;
    Py_DECREF(taken);
    return 0;
}

// request_post_multi([req, ...], [[bytes, ...], ...]) -> [taken, ...]:
// request_send_multi, posted. Entry i is len(batches[i]) for a request whose
// items were posted (the library takes them all), else request_send_multi's
// answer: for a request the library lists as full (dc_posted_full), for
// every request while more are full than the list holds, posting is off or
// DC_POSTED_MAX_AHEAD messages wait for the library, for a request whose
// items exceed one message, and for the requests of a message the socket
// refused and after it. A malformed argument raises before anything is
// posted or queued; once anything is posted nothing raises (an error of the
// call is then each of its requests' -DC_EIO). Each request appears once
// (the loop's _Sends hands over a dict's).
static PyObject* mod_request_post_multi(PyObject* m, PyObject* args) {
    PyObject *reqs, *batches;
    if (!PyArg_ParseTuple(args, "O!O!:request_post_multi", &PyList_Type, &reqs, &PyList_Type, &batches)) return NULL;
    if (check_fork() < 0) return NULL;
    Py_ssize_t n = PyList_Size(reqs);
    uint64_t over = __atomic_load_n(&dc_posted_over, __ATOMIC_SEQ_CST);
    if (PyList_Size(batches) != n || n == 0 || (over != DC_POSTED_ALL_POST && over != DC_POSTED_SOME) || post_socket() < 0 ||
        !post_ahead_ok())
        return send_multi_lists(reqs, batches);
    // Per request: its handle, its record's size, whether it goes by the call.
    char* mem = PyMem_Malloc((size_t)n * (sizeof(uint64_t) + sizeof(size_t) + 1));
    if (mem == NULL) return PyErr_NoMemory();
    uint64_t* hs = (uint64_t*)mem;
    size_t* sizes = (size_t*)(hs + n);
    char* by_call = (char*)(sizes + n);
    size_t total = 0;
    Py_ssize_t calls = 0; // the requests that go by the call
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* r = PyList_GetItem(reqs, i);
        unsigned long long h = PyLong_Check(r) ? PyLong_AsUnsignedLongLong(r) : 0;
        size_t size = record_size(PyList_GetItem(batches, i));
        if (!PyLong_Check(r) || (h == (unsigned long long)-1 && PyErr_Occurred()) || size == 0) {
            PyErr_Clear(); // the call raises what is wrong
            PyMem_Free(mem);
            return send_multi_lists(reqs, batches);
        }
        hs[i] = h;
        sizes[i] = size;
        by_call[i] = size > DC_POST_MAX_MESSAGE - 4 || (over == DC_POSTED_SOME && listed_full(h));
        calls += by_call[i];
        if (!by_call[i]) total += size;
    }
    size_t cap = 4 + total < DC_POST_MAX_MESSAGE ? 4 + total : DC_POST_MAX_MESSAGE;
    char* msg = calls < n ? PyMem_Malloc(cap) : NULL;
    PyObject* out = (msg || calls == n) ? PyList_New(n) : NULL;
    // The answers of posted requests, made before anything is posted: once
    // something is, nothing may raise (the loop would send it again).
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject* v = PyLong_FromSsize_t(PyList_Size(PyList_GetItem(batches, k)));
        if (v == NULL) Py_CLEAR(out);
        else PyList_SetItem(out, k, v); // steals v
    }
    PyObject* eio = out ? PyLong_FromLong(-(long)DC_EIO) : NULL; // the answer of a failed call, below
    if (eio == NULL) {
        Py_XDECREF(out);
        PyMem_Free(msg);
        PyMem_Free(mem);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    // Whole requests per message, in order; a message's requests count as
    // taken once it is written. After a refused one, the rest go by the call.
    int posted_any = 0;
    Py_ssize_t i = 0;
    while (calls < n && i < n) {
        put_u32(msg, KIND_ITEMS);
        char* p = msg + 4;
        Py_ssize_t from = i;
        for (; i < n && (by_call[i] || (size_t)(p - msg) + sizes[i] <= cap); i++)
            if (!by_call[i]) p = put_record(p, hs[i], PyList_GetItem(batches, i));
        if (p == msg + 4) continue; // only requests that go by the call
        if (post(msg, (size_t)(p - msg)) < 0) {
            for (Py_ssize_t k = from; k < n; k++) by_call[k] = 1;
            calls = n - from; // at least one, which is all that counts below
            break;
        }
        posted_any = 1;
    }
    PyMem_Free(msg);
    if (calls > 0 && call_marked(reqs, batches, by_call, out) < 0) {
        if (!posted_any) { // nothing posted: the call's error is the answer
            Py_DECREF(eio);
            Py_DECREF(out);
            PyMem_Free(mem);
            return NULL;
        }
        PyErr_Clear(); // the posted ones are out; the others stay with the loop, whose next call raises it
        for (Py_ssize_t k = 0; k < n; k++) {
            if (!by_call[k]) continue;
            Py_INCREF(eio);
            PyList_SetItem(out, k, eio); // steals the new reference
        }
    }
    Py_DECREF(eio);
    PyMem_Free(mem);
    return out;
}

// post_host_tick(rt): runtime_host_tick, posted (a handle freed meanwhile is
// then ignored, where the call raises).
static PyObject* mod_post_host_tick(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    char msg[12];
    put_u32(msg, KIND_HOST_TICK);
    put_u64(msg + 4, h);
    if (post(msg, sizeof msg) == 0) Py_RETURN_NONE;
    return call_h(arg, dc_runtime_host_tick, 0);
}

// post_engine_load(ep, waiting, kv_usage): endpoint_set_engine_load, posted;
// the call where the arguments are not what it takes (it raises) or it
// cannot be posted.
static PyObject* mod_post_engine_load(PyObject* m, PyObject* args) {
    unsigned long long h;
    long long waiting;
    double kv;
    if (PyArg_ParseTuple(args, "KLd", &h, &waiting, &kv) && check_fork() == 0 && isfinite(kv)) {
        char msg[28];
        put_u32(msg, KIND_ENGINE_LOAD);
        put_u64(msg + 4, h);
        put_u64(msg + 12, (uint64_t)waiting);
        memcpy(msg + 20, &kv, 8);
        if (post(msg, sizeof msg) == 0) Py_RETURN_NONE;
    }
    PyErr_Clear();
    return endpoint_set_engine_load_call(m, args);
}

// engine_outputs_post(kind, reader, id, request): a route of the engine-output
// reader (4 reserve, 5 activate, 6 drop: dc_engine_outputs_reserve, _activate,
// _drop), posted; the call where it cannot be posted (more than
// DC_POSTED_MAX_AHEAD wait, the socket is full), which answers as the posted
// message would: an activation's answer is dropped (the outputs' flags tell the
// host), and a handle that is no longer valid (DC_EBADF: the host freed the
// reader, or the request ended; an activation's route is then dropped) raises
// nothing, as a posted record with one is dropped.
static PyObject* mod_engine_outputs_post(PyObject* m, PyObject* args) {
    int kind;
    unsigned long long h, req;
    const char* id;
    Py_ssize_t id_len;
    if (!PyArg_ParseTuple(args, "iKy#K:engine_outputs_post", &kind, &h, &id, &id_len, &req) || check_fork() < 0)
        return NULL;
    if (kind < KIND_ENGINE_RESERVE || kind > KIND_ENGINE_DROP) {
        PyErr_SetString(PyExc_ValueError, "engine_outputs_post: kind must be 4, 5 or 6");
        return NULL;
    }
    char small[512];
    if ((size_t)id_len <= sizeof small - 24) {
        put_u32(small, (uint32_t)kind);
        put_u64(small + 4, (uint64_t)h);
        put_u64(small + 12, kind == KIND_ENGINE_ACTIVATE ? (uint64_t)req : 0);
        put_u32(small + 20, (uint32_t)id_len);
        memcpy(small + 24, id, (size_t)id_len);
        if (post(small, 24 + (size_t)id_len) == 0) Py_RETURN_NONE;
    }
    int rc, armed = 0;
    if (kind == KIND_ENGINE_RESERVE)
        rc = dc_engine_outputs_reserve((uint64_t)h, id, (size_t)id_len);
    else if (kind == KIND_ENGINE_ACTIVATE)
        rc = dc_engine_outputs_activate((uint64_t)h, id, (size_t)id_len, (uint64_t)req, &armed);
    else
        rc = dc_engine_outputs_drop((uint64_t)h, id, (size_t)id_len);
    if (rc != DC_OK && rc != DC_EBADF) return raise_rc(rc);
    Py_RETURN_NONE;
}

// engine_inputs_send(reader, frames): a message for the engine core through
// the reader's input socket (frames: a sequence of bytes, the first naming
// the peer, as a ROUTER socket's send_multipart takes them:
// dc_engine_inputs_send), posted; the call where it cannot be posted (too
// large, or the socket refuses it).
static PyObject* mod_engine_inputs_send(PyObject* m, PyObject* args) {
    unsigned long long h;
    PyObject* seq;
    if (!PyArg_ParseTuple(args, "KO:engine_inputs_send", &h, &seq) || check_fork() < 0) return NULL;
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    if (n < 2 || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "engine_inputs_send: 2 to 4096 frames (the first names the peer)");
        return NULL;
    }
    PyObject* result = NULL;
    char* buf = NULL;
    Py_ssize_t got = 0;
    PyObject** frames = PyMem_Calloc((size_t)n, sizeof(PyObject*));
    if (frames == NULL) return PyErr_NoMemory();
    size_t size = 16; // kind, reader, frame count
    for (; got < n; got++) {
        frames[got] = PySequence_GetItem(seq, got);
        if (frames[got] == NULL) goto done;
        if (!PyBytes_Check(frames[got])) {
            got++;
            PyErr_SetString(PyExc_TypeError, "engine_inputs_send: every frame must be bytes");
            goto done;
        }
        Py_ssize_t len = PyBytes_Size(frames[got]);
        if ((uint64_t)len > UINT32_MAX || size > SIZE_MAX / 2) {
            got++;
            PyErr_SetString(PyExc_ValueError, "engine_inputs_send: a frame over 4 GiB");
            goto done;
        }
        size += 4 + (size_t)len;
    }
    buf = PyMem_Malloc(size);
    if (buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    put_u32(buf, KIND_ENGINE_INPUT);
    put_u64(buf + 4, (uint64_t)h);
    put_u32(buf + 12, (uint32_t)n);
    char* p = buf + 16;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = PyBytes_Size(frames[i]);
        put_u32(p, (uint32_t)len);
        if (len > 0) memcpy(p + 4, PyBytes_AsString(frames[i]), (size_t)len);
        p += 4 + len;
    }
    if (size > DC_POST_MAX_MESSAGE || post(buf, size) != 0) {
        // A reader freed meanwhile (DC_EBADF) drops it, as a posted one.
        int rc = dc_engine_inputs_send((uint64_t)h, buf + 12, size - 12);
        if (rc != DC_OK && rc != DC_EBADF) {
            raise_rc(rc);
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t i = 0; i < got; i++) Py_XDECREF(frames[i]);
    PyMem_Free(frames);
    PyMem_Free(buf);
    return result;
}

PyMethodDef post_methods[] = {
    {"engine_inputs_send", mod_engine_inputs_send, METH_VARARGS,
     "engine_inputs_send(reader, frames): a message for the engine core, posted"},
    {"engine_outputs_post", mod_engine_outputs_post, METH_VARARGS,
     "engine_outputs_post(kind, reader, id, request): an engine-output route, posted"},
    {"request_post_multi", mod_request_post_multi, METH_VARARGS,
     "request_post_multi([req, ...], [[data, ...], ...]) -> [taken or -code, ...]: request_send_multi, posted"},
    {"post_host_tick", mod_post_host_tick, METH_O, "post_host_tick(rt): runtime_host_tick, posted"},
    {"post_engine_load", mod_post_engine_load, METH_VARARGS,
     "post_engine_load(ep, waiting, kv_usage): endpoint_set_engine_load, posted"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
