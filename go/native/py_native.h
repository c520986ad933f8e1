// py_native.h: what the C files of the CPython extension module
// dynamo_ctx._native share (internal: never installed, never included by a
// C user). Each py_*.c file holds one part of the module and includes this
// first; py_module.c assembles the module.
//
// What the C layer holds, and no more: conversion between Python objects
// and the C ABI's arguments and results; releasing the GIL around calls
// that may wait or walk a tree; raising a library error through the table
// the package registered (py_common.c); and, for speed, four things done
// here rather than in Go or Python: the state-word load (is_stopped(),
// is_killed(): a memory read, no call) and the word and id a Context keeps
// until its Go side is made (py_context.c), the reader of the tokens an
// event queue's fd carries (queue_read, py_queue.c), the batching of many
// requests' items into few library calls (py_plane.c), and the encoder of
// common response items (py_json.c, which leaves anything else to Python's
// encoder). No rule of docs/design.md is decided here: ids
// (dc_id_check), state transitions (dc_state_word_next), endpoint paths,
// and the exception for each error code are asked of Go or of the package.
//
// The module lives in the same shared library as the C ABI it wraps, and is
// built against the stable ABI (Py_LIMITED_API 3.9), so one library serves
// every CPython from 3.9 on. It is compiled only when Python.h is on the
// include path (build.py puts it there): without it DC_WITH_PYTHON stays
// undefined, every py_*.c file compiles to nothing (each wraps its body in
// #ifdef DC_WITH_PYTHON) and the library is the plain C ABI.
#ifndef DC_PY_NATIVE_H
#define DC_PY_NATIVE_H

#if defined(__has_include)
#if __has_include(<Python.h>)
#define DC_WITH_PYTHON 1
#endif
#endif

#ifdef DC_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03090000
#include <Python.h>
#include <stdint.h>
#include "dynamo_ctx.h" // the public header: the library's own functions, const-correct

// Every Python symbol the module uses is a weak reference, so the library
// loads (and its plain C ABI works) in a process without an interpreter: the
// interpreter, when there is one, resolves them at import. The list is here,
// where every py_*.c file sees it; keep it complete:
// python/tests/test_packaging.py fails on a strong Python symbol.
#pragma weak PyBool_FromLong
#pragma weak PyBytes_AsString
#pragma weak PyBytes_AsStringAndSize
#pragma weak PyBytes_FromStringAndSize
#pragma weak PyBytes_Size
#pragma weak PyCallable_Check
#pragma weak PyDict_New
#pragma weak PyDict_Next
#pragma weak PyDict_SetItem
#pragma weak PyDict_Type
#pragma weak PyErr_Clear
#pragma weak PyErr_ExceptionMatches
#pragma weak PyErr_Fetch
#pragma weak PyErr_Format
#pragma weak PyErr_NoMemory
#pragma weak PyErr_Occurred
#pragma weak PyErr_Restore
#pragma weak PyErr_SetFromErrno
#pragma weak PyErr_SetObject
#pragma weak PyErr_SetString
#pragma weak PyEval_RestoreThread
#pragma weak PyEval_SaveThread
#pragma weak PyExc_Exception
#pragma weak PyExc_OSError
#pragma weak PyExc_RuntimeError
#pragma weak PyExc_TypeError
#pragma weak PyExc_UnicodeEncodeError
#pragma weak PyExc_ValueError
#pragma weak PyFloat_AsDouble
#pragma weak PyFloat_FromDouble
#pragma weak PyList_Append
#pragma weak PyList_GetItem
#pragma weak PyList_GetSlice
#pragma weak PyList_New
#pragma weak PyList_SetItem
#pragma weak PyList_Size
#pragma weak PyList_Type
#pragma weak PyLong_AsLong
#pragma weak PyLong_AsLongLongAndOverflow
#pragma weak PyLong_AsUnsignedLongLong
#pragma weak PyLong_FromLong
#pragma weak PyLong_FromLongLong
#pragma weak PyLong_FromSize_t
#pragma weak PyLong_FromSsize_t
#pragma weak PyLong_FromUnsignedLong
#pragma weak PyLong_FromUnsignedLongLong
#pragma weak PyLong_Type
#pragma weak PyMem_Calloc
#pragma weak PyMem_Free
#pragma weak PyMem_Malloc
#pragma weak PyMem_Realloc
#pragma weak PyModule_AddFunctions
#pragma weak PyModule_AddIntConstant
#pragma weak PyModule_AddObject
#pragma weak PyModule_AddStringConstant
#pragma weak PyModule_Create2
#pragma weak PyObject_CallFunction
#pragma weak PyObject_CallFunctionObjArgs
#pragma weak PyObject_CallObject
#pragma weak PyObject_IsInstance
#pragma weak PyObject_IsSubclass
#pragma weak PyObject_SetAttrString
#pragma weak PyObject_Type
#pragma weak PySequence_GetItem
#pragma weak PySequence_Size
#pragma weak PyTuple_GetItem
#pragma weak PyTuple_New
#pragma weak PyTuple_SetItem
#pragma weak PyTuple_Size
#pragma weak PyTuple_Type
#pragma weak PyType_FromSpec
#pragma weak PyType_GetFlags
#pragma weak PyType_GetSlot
#pragma weak PyUnicode_AsEncodedString
#pragma weak PyUnicode_AsUTF8String
#pragma weak PyUnicode_DecodeUTF8
#pragma weak PyUnicode_FromString
#pragma weak PyUnicode_GetLength
#pragma weak PyUnicode_ReadChar
#pragma weak PyUnicode_Type
#pragma weak _PyArg_ParseTupleAndKeywords_SizeT
#pragma weak _PyArg_ParseTuple_SizeT
#pragma weak _PyObject_CallFunction_SizeT
#pragma weak _Py_BuildValue_SizeT
#pragma weak _Py_Dealloc
#pragma weak _Py_FalseStruct
#pragma weak _Py_NoneStruct
#pragma weak _Py_TrueStruct

// What one py_*.c file defines for the others: hidden, so the library
// exports nothing of the module but PyInit__native.
#define DC_HIDDEN __attribute__((visibility("hidden")))

// ---------------------------------------------------------------- py_common.c

// The Go runtime's threads do not survive fork(): a call into Go in the child
// would hang. dc_forked is set in a child forked after the module was loaded
// (fork_guard_install arms it), and every function that would enter Go calls
// check_fork first, which raises there. is_stopped/is_killed only read memory
// and keep working.
extern DC_HIDDEN volatile int dc_forked;
DC_HIDDEN void fork_guard_install(void);
DC_HIDDEN int check_fork(void);

// Raises the exception for error code rc with the calling thread's last error
// message (by the table the package registered); returns NULL.
DC_HIDDEN PyObject* raise_rc(int rc);

// After this thread cancelled a context: calls the package's registered
// flush, which delivers what the cancellation woke on this thread's running
// event loop; returns None (or NULL on error).
DC_HIDDEN PyObject* flush_local(uint64_t ticket);

// Stores in *q the event queue of this thread's running event loop (the
// package's registered local_queue), or 0 for none; -1 with the exception
// set only for one that is not an Exception (KeyboardInterrupt), else 0.
DC_HIDDEN int local_queue(uint64_t* q);

// flush_local for a cancel whose tokens for this thread's loop came back in
// toks (dc_context_cancel_local): the flush delivers them, not the fd; if
// it cannot, they go back to queue q's fd.
DC_HIDDEN PyObject* flush_local_tokens(uint64_t ticket, uint64_t q, const uint64_t* toks, size_t n);

// An int argument as a uint64_t handle; -1 with an exception set.
DC_HIDDEN int parse_u64(PyObject* o, uint64_t* out);

// Calls fn, a function of one handle (the argument) that returns only a
// code, with the GIL released when release is set; None, or the error raised.
DC_HIDDEN PyObject* call_h(PyObject* arg, int (*fn)(uint64_t), int release);

// Reads a string-valued property of h through a dc_*(h, buf, cap, &len)
// function, as str (as_str) or bytes.
DC_HIDDEN PyObject* get_bytes(uint64_t h, int (*fn)(uint64_t, char*, size_t, size_t*), int as_str);

// Calls that take locks in Go (a cancel may walk a large tree) release the GIL.
#define CALL_RELEASED(rc, expr) \
    do {                          \
        Py_BEGIN_ALLOW_THREADS    \
        rc = (expr);              \
        Py_END_ALLOW_THREADS      \
    } while (0)

// ---------------------------------------------------------------- py_context.c

// A Context made in Python has no Go side until something needs one: a link,
// a child, an await, a request sent with it, its handle. Until then its state
// lives in inline_word (the library's state word: see DC_STATE_MASK in
// dynamo_ctx.h) and its id in id (NULL: a uuid not drawn yet), so
// creating and dropping a context never enters Go. Materializing creates the
// Go context with that id and state and points word at the library's word.
// Everything here runs with the GIL held, so no cancel can slip between
// reading inline_word and switching word.
typedef struct {
    PyObject_HEAD
    uint64_t handle;         // 0 while there is no Go side (or once released)
    const uint32_t* word;    // &inline_word, or the library's state word while handle is valid
    PyObject* id;            // str; NULL for a uuid not drawn yet, or an id not fetched yet
    uint32_t inline_word;    // the state while there is no Go side
} ContextObject;

extern DC_HIDDEN PyTypeObject* ContextType; // set at module init; the module keeps it alive

// Gives the context its Go side if it has none. -1 with an exception set on failure.
DC_HIDDEN int materialize(ContextObject* self);

// 0 if o is a Context, else -1 with TypeError set.
DC_HIDDEN int context_check(PyObject* o);

// Wraps a context handle made by the library (fn(h, &ctx), fmt parses (h, cls))
// into an instance of cls, a subclass of the native Context type.
DC_HIDDEN PyObject* wrap_context_from(PyObject* args, int (*fn)(uint64_t, uint64_t*), const char* fmt);

// Creates the Context type and adds it to the module m; -1 with an exception set.
DC_HIDDEN int context_add_type(PyObject* m);

// request_send_multi(reqs, batches) on two lists already checked to be
// lists (py_plane.c): the items handed over by a call into the library.
DC_HIDDEN PyObject* send_multi_lists(PyObject* reqs, PyObject* batches);

// endpoint_set_engine_load(ep, waiting, kv_usage), the call (py_plane.c).
DC_HIDDEN PyObject* endpoint_set_engine_load_call(PyObject* m, PyObject* args);

// ---------------------------------------------------------------- the methods of each part

// Each py_*.c file's module functions; py_module.c adds them all.
extern DC_HIDDEN PyMethodDef common_methods[];
extern DC_HIDDEN PyMethodDef queue_methods[];
extern DC_HIDDEN PyMethodDef plane_methods[];
extern DC_HIDDEN PyMethodDef client_methods[];
extern DC_HIDDEN PyMethodDef json_methods[];
extern DC_HIDDEN PyMethodDef status_methods[];
extern DC_HIDDEN PyMethodDef model_methods[];
extern DC_HIDDEN PyMethodDef trace_methods[];
extern DC_HIDDEN PyMethodDef post_methods[];
extern DC_HIDDEN PyMethodDef engine_methods[];

#endif // DC_WITH_PYTHON
#endif // DC_PY_NATIVE_H
