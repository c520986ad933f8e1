// py_client.c: the caller's side of the request plane in the extension
// module: clients, and the response streams their requests return (items
// taken as bytes or as one JSON text, the kill checks that guard the items a
// caller holds). py_plane.c has the serving side.
#include "py_native.h"

#ifdef DC_WITH_PYTHON
#include <string.h>

static PyObject* code_and_message(int rc) {
    char msg[DC_ERROR_MESSAGE_MAX];
    dc_last_error(msg, sizeof msg);
    return Py_BuildValue("(is)", rc, msg);
}

static PyObject* mod_client_new(PyObject* m, PyObject* args) {
    unsigned long long rt;
    const char* path;
    Py_ssize_t path_len;
    if (!PyArg_ParseTuple(args, "Ks#:client_new", &rt, &path, &path_len)) return NULL;
    if (check_fork() < 0) return NULL;
    uint64_t h = 0;
    int rc;
    CALL_RELEASED(rc, dc_client_new(rt, (char*)path, (size_t)path_len, &h));
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject* mod_client_instances(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    uint64_t small[64];
    uint64_t* buf = small;
    size_t cap = 64, n = 0;
    int rc = dc_client_instances(h, buf, cap, &n);
    if (rc == DC_ERANGE) {
        cap = n + 16;
        buf = PyMem_Malloc(cap * sizeof(uint64_t));
        if (buf == NULL) return PyErr_NoMemory();
        rc = dc_client_instances(h, buf, cap, &n);
    }
    PyObject* out = NULL;
    if (rc == DC_OK && (out = PyList_New((Py_ssize_t)n)) != NULL) {
        for (size_t i = 0; i < n; i++) {
            PyObject* v = PyLong_FromUnsignedLongLong(buf[i]);
            if (v == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SetItem(out, (Py_ssize_t)i, v);
        }
    }
    if (buf != small) PyMem_Free(buf);
    if (rc != DC_OK) return raise_rc(rc);
    return out;
}

static PyObject* mod_client_generate(PyObject* m, PyObject* args) {
    unsigned long long h, instance = 0;
    const char* payload;
    Py_ssize_t len;
    PyObject* ctx = Py_None;
    int route = 0;
    const char* meta = NULL;
    Py_ssize_t meta_len = 0;
    if (!PyArg_ParseTuple(args, "Ky#|OiKz#:client_generate", &h, &payload, &len, &ctx, &route, &instance, &meta, &meta_len)) return NULL;
    uint64_t ctx_h = 0;
    if (ctx != Py_None) {
        if (context_check(ctx) < 0) return NULL;
        if (materialize((ContextObject*)ctx) < 0) return NULL;
        ctx_h = ((ContextObject*)ctx)->handle;
    }
    if (check_fork() < 0) return NULL;
    uint64_t s = 0;
    int rc;
    if (meta == NULL) {
        CALL_RELEASED(rc, dc_client_generate(h, (char*)payload, (size_t)len, ctx_h, route, instance, &s));
    } else {
        CALL_RELEASED(rc, dc_client_generate_metadata(h, (char*)payload, (size_t)len, (char*)meta, (size_t)meta_len, ctx_h, route, instance, &s));
    }
    if (rc != DC_OK) return raise_rc(rc);
    return PyLong_FromUnsignedLongLong(s);
}

static PyObject* mod_client_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_client_free, 1); }

static PyObject* mod_client_set_migration_limit(PyObject* m, PyObject* args) {
    unsigned long long h;
    int limit;
    if (!PyArg_ParseTuple(args, "Ki:client_set_migration_limit", &h, &limit)) return NULL;
    if (check_fork() < 0) return NULL;
    int rc = dc_client_set_migration_limit(h, limit);
    if (rc != DC_OK) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject* mod_stream_started(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int rc = dc_stream_started(h);
    if (rc == DC_EBADF || rc == DC_EINTERNAL) return raise_rc(rc);
    return code_and_message(rc);
}

// The items a take stored in buf: 4-byte little-endian length, then the bytes.
static uint32_t item_len(const char* p) {
    return (uint32_t)(unsigned char)p[0] | (uint32_t)(unsigned char)p[1] << 8 | (uint32_t)(unsigned char)p[2] << 16 |
           (uint32_t)(unsigned char)p[3] << 24;
}

// A list of bytes, one per item.
static PyObject* items_as_list(const char* buf, size_t used, size_t count) {
    PyObject* items = PyList_New((Py_ssize_t)count);
    size_t off = 0;
    for (size_t i = 0; items != NULL && i < count; i++) {
        uint32_t n = item_len(buf + off);
        PyObject* b = PyBytes_FromStringAndSize(buf + off + 4, (Py_ssize_t)n);
        if (b == NULL) {
            Py_CLEAR(items);
            break;
        }
        PyList_SetItem(items, (Py_ssize_t)i, b);
        off += 4 + (size_t)n;
    }
    return items;
}

// The text of one JSON array of the items: each item is a JSON value the
// library checked, so joined with commas inside brackets they are an array.
// At most used + 2 bytes ("[]" when nothing was taken).
static PyObject* items_as_json(const char* buf, size_t used, size_t count) {
    char* text = PyMem_Malloc(used + 2);
    if (text == NULL) return PyErr_NoMemory();
    size_t off = 0, w = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t n = item_len(buf + off);
        text[w++] = i == 0 ? '[' : ',';
        memcpy(text + w, buf + off + 4, n);
        w += n;
        off += 4 + (size_t)n;
    }
    if (count == 0) text[w++] = '[';
    text[w++] = ']';
    PyObject* str = PyUnicode_DecodeUTF8(text, (Py_ssize_t)w, NULL);
    PyMem_Free(text);
    return str;
}

// Takes what the stream has: (DC_OK, convert(items)) or (code, message).
static PyObject* stream_take_as(PyObject* arg, PyObject* (*convert)(const char*, size_t, size_t)) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    char small[16384];
    char* buf = small;
    size_t cap = sizeof small, used = 0, count = 0;
    int rc = dc_stream_take(h, buf, cap, &used, &count);
    if (rc == DC_ERANGE) {
        cap = used;
        buf = PyMem_Malloc(cap);
        if (buf == NULL) return PyErr_NoMemory();
        rc = dc_stream_take(h, buf, cap, &used, &count);
    }
    PyObject* out = NULL;
    if (rc == DC_OK) {
        PyObject* v = convert(buf, used, count);
        if (v != NULL) out = Py_BuildValue("(iN)", rc, v);
    } else if (rc == DC_EBADF || rc == DC_EINTERNAL || rc == DC_EINVAL) {
        raise_rc(rc);
    } else {
        out = code_and_message(rc);
    }
    if (buf != small) PyMem_Free(buf);
    return out;
}

// stream_take(s) -> (DC_OK, [bytes, ...]) or (code, message).
static PyObject* mod_stream_take(PyObject* m, PyObject* arg) { return stream_take_as(arg, items_as_list); }

// stream_take_json(s) -> (code, str): stream_take with the items as the text
// of one JSON array, ready for a single json.loads: no object per item.
static PyObject* mod_stream_take_json(PyObject* m, PyObject* arg) { return stream_take_as(arg, items_as_json); }

static PyObject* mod_stream_context(PyObject* m, PyObject* args) {
    return wrap_context_from(args, (int (*)(uint64_t, uint64_t*))dc_stream_context, "KO:stream_context");
}

static PyObject* mod_stream_kill(PyObject* m, PyObject* arg) { return call_h(arg, dc_stream_kill, 1); }
static PyObject* mod_stream_free(PyObject* m, PyObject* arg) { return call_h(arg, dc_stream_free, 1); }

extern uint64_t dc_kill_epoch; // kill_epoch.c

// kill_epoch() -> int: how many contexts this process has killed so far. A
// stream that stream_killed found not killed is still not killed while this
// has not changed since (read it before asking). Reads memory only.
static PyObject* mod_kill_epoch(PyObject* m, PyObject* unused) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&dc_kill_epoch, __ATOMIC_ACQUIRE));
}

static PyObject* mod_stream_killed(PyObject* m, PyObject* arg) {
    uint64_t h;
    if (parse_u64(arg, &h) < 0 || check_fork() < 0) return NULL;
    int killed = 0;
    int rc = dc_stream_killed(h, &killed);
    if (rc != DC_OK) return raise_rc(rc);
    if (killed) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

PyMethodDef client_methods[] = {
    {"client_new", mod_client_new, METH_VARARGS, "client_new(rt, path) -> handle (blocks briefly)"},
    {"client_instances", mod_client_instances, METH_O, "client_instances(cl) -> list of ids"},
    {"client_generate", mod_client_generate, METH_VARARGS, "client_generate(cl, payload, ctx=None, route=0, instance=0, metadata=None) -> stream"},
    {"client_free", mod_client_free, METH_O, "client_free(cl)"},
    {"client_set_migration_limit", mod_client_set_migration_limit, METH_VARARGS, "client_set_migration_limit(cl, n)"},
    {"stream_started", mod_stream_started, METH_O, "stream_started(s) -> (code, message)"},
    {"stream_take", mod_stream_take, METH_O, "stream_take(s) -> (0, [bytes]) or (code, message)"},
    {"stream_context", mod_stream_context, METH_VARARGS, "stream_context(s, cls) -> Context"},
    {"stream_kill", mod_stream_kill, METH_O, "stream_kill(s)"},
    {"stream_take_json", mod_stream_take_json, METH_O, "stream_take_json(s) -> (code, '[item,...]' | message)"},
    {"stream_killed", mod_stream_killed, METH_O, "stream_killed(s) -> bool"},
    {"kill_epoch", mod_kill_epoch, METH_NOARGS, "kill_epoch() -> how many contexts were killed so far"},
    {"stream_free", mod_stream_free, METH_O, "stream_free(s)"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
