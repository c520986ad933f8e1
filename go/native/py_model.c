// py_model.c: model_card, the extension module's builder of a worker's model
// card (dc_model_card: go/modelcard defines and checks the card).
#include "py_native.h"

#ifdef DC_WITH_PYTHON

// model_card(model, mode, migration_limit=0, max_num_seqs=0, max_model_len=0,
// model_path=None, supports=None, tool_call_parser=None, reasoning_parser=None) -> str: the card's JSON. Reading the model directory may
// take a while: the GIL is released meanwhile.
static PyObject* mod_model_card(PyObject* m, PyObject* args, PyObject* kwds) {
    static char* kwlist[] = {"model", "mode", "migration_limit", "max_num_seqs", "max_model_len", "model_path", "supports",
                             "tool_call_parser", "reasoning_parser", NULL};
    const char *model, *mode, *path = NULL, *supports = NULL, *tools = NULL, *reasoning = NULL;
    Py_ssize_t model_len, mode_len, path_len = 0, supports_len = 0, tools_len = 0, reasoning_len = 0;
    long long migration_limit = 0, max_num_seqs = 0, max_model_len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s#s#|LLLz#z#z#z#:model_card", kwlist, &model, &model_len, &mode, &mode_len,
                                     &migration_limit, &max_num_seqs, &max_model_len, &path, &path_len, &supports,
                                     &supports_len, &tools, &tools_len, &reasoning, &reasoning_len))
        return NULL;
    if (check_fork() < 0) return NULL;
    char* buf = PyMem_Malloc(DC_MODEL_CARD_MAX_BYTES + 1);
    if (buf == NULL) return PyErr_NoMemory();
    size_t n = 0;
    int rc;
    CALL_RELEASED(rc, dc_model_card(model, (size_t)model_len, mode, (size_t)mode_len, migration_limit, max_num_seqs, max_model_len,
                                    path, (size_t)path_len, supports, (size_t)supports_len, tools, (size_t)tools_len, reasoning,
                                    (size_t)reasoning_len, buf, DC_MODEL_CARD_MAX_BYTES + 1,
                                    &n));
    PyObject* out = rc == DC_OK ? PyUnicode_DecodeUTF8(buf, (Py_ssize_t)n, "strict") : NULL;
    PyMem_Free(buf);
    if (rc != DC_OK) return raise_rc(rc);
    return out;
}

PyMethodDef model_methods[] = {
    {"model_card", (PyCFunction)(void (*)(void))mod_model_card, METH_VARARGS | METH_KEYWORDS,
     "model_card(model, mode, migration_limit=0, max_num_seqs=0, max_model_len=0, model_path=None, supports=None, tool_call_parser=None, "
     "reasoning_parser=None) -> the card's JSON"},
    {NULL, NULL, 0, NULL},
};

#endif // DC_WITH_PYTHON
