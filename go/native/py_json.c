// py_json.c: encode_json, the extension module's encoder of response items:
// the common items encoded without Python's encoder, for speed (see below).
#include "py_native.h"

#ifdef DC_WITH_PYTHON
#include <stdio.h>
#include <string.h>

// --- encode_json: the common items, encoded without Python's encoder ------------
//
// A response item is encoded once per item on the worker's hottest path;
// Python's C encoder costs a call, a list of chunks and a join each time.
// This covers what items usually are (None, bools, ints, printable ASCII
// strings, and lists, tuples and str-keyed dicts of those) with exactly
// json.dumps(separators=(",", ":"))'s bytes, and answers None for anything
// else (floats, other strings, subclasses, deep nesting), which the caller
// then encodes with Python's encoder: the rules stay Python's.

typedef struct {
    char* p;
    size_t n, cap;
    char small[512];
} jbuf;

static int jb_put(jbuf* b, const char* s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->n + n) cap *= 2;
        char* p = b->p == b->small ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
        if (p == NULL) return -1;
        if (b->p == b->small) memcpy(p, b->small, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

// 1 encoded, 0 not handled here, -1 error (a Python exception is set).
static int jenc(jbuf* b, PyObject* o, int depth) {
    if (depth > 32) return 0;
    if (o == Py_None) return jb_put(b, "null", 4) < 0 ? -1 : 1;
    if (o == Py_True) return jb_put(b, "true", 4) < 0 ? -1 : 1;
    if (o == Py_False) return jb_put(b, "false", 5) < 0 ? -1 : 1;
    PyTypeObject* t = Py_TYPE(o);
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow != 0) return 0;
        if (v == -1 && PyErr_Occurred()) return -1;
        char num[24];
        int k = snprintf(num, sizeof num, "%lld", v);
        return jb_put(b, num, (size_t)k) < 0 ? -1 : 1;
    }
    if (t == &PyUnicode_Type) {
        Py_ssize_t len = PyUnicode_GetLength(o);
        if (len < 0) return -1;
        char chunk[128];
        size_t k = 0;
        if (jb_put(b, "\"", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < len; i++) {
            Py_UCS4 c = PyUnicode_ReadChar(o, i);
            if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return 0; // escaped by Python's rules
            chunk[k++] = (char)c;
            if (k == sizeof chunk) {
                if (jb_put(b, chunk, k) < 0) return -1;
                k = 0;
            }
        }
        if (jb_put(b, chunk, k) < 0 || jb_put(b, "\"", 1) < 0) return -1;
        return 1;
    }
    // Items, keys and values are borrowed: nothing here runs Python code, so
    // no container can change while it is encoded.
    if (t == &PyList_Type || t == &PyTuple_Type) {
        int list = t == &PyList_Type;
        Py_ssize_t len = list ? PyList_Size(o) : PyTuple_Size(o);
        if (len < 0 || jb_put(b, "[", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < len; i++) {
            if (i > 0 && jb_put(b, ",", 1) < 0) return -1;
            PyObject* item = list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);
            if (item == NULL) return -1;
            int r = jenc(b, item, depth + 1);
            if (r <= 0) return r;
        }
        return jb_put(b, "]", 1) < 0 ? -1 : 1;
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int first = 1;
        if (jb_put(b, "{", 1) < 0) return -1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type) return 0;
            if (!first && jb_put(b, ",", 1) < 0) return -1;
            first = 0;
            int r = jenc(b, k, depth + 1);
            if (r <= 0) return r;
            if (jb_put(b, ":", 1) < 0) return -1;
            r = jenc(b, v, depth + 1);
            if (r <= 0) return r;
        }
        return jb_put(b, "}", 1) < 0 ? -1 : 1;
    }
    return 0;
}

// encode_json(value) -> bytes, or None when Python's encoder must do it.
static PyObject* mod_encode_json(PyObject* m, PyObject* value) {
    jbuf b;
    b.p = b.small;
    b.n = 0;
    b.cap = sizeof b.small;
    int r = jenc(&b, value, 0);
    PyObject* out = NULL;
    if (r > 0) {
        out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
    } else if (r == 0) {
        out = Py_None;
        Py_INCREF(out);
    }
    if (b.p != b.small) PyMem_Free(b.p);
    return out;
}

PyMethodDef json_methods[] = {
    {"encode_json", mod_encode_json, METH_O, "encode_json(value) -> compact JSON bytes, or None: use Python's encoder"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
