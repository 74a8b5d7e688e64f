/* kvmesh.router._fastpath: the router's hot path in C (the key chain and the prefix match).
 *
 * Same results as the pure-Python code in router/routing/keys.py and router/routing/index.py (a hypothesis test
 * compares both; KVMESH_NO_NATIVE=1 forces the Python path):
 *
 *   chain_keys(tokens, num_blocks, block_size, parent_key, extras) -> list[int]
 *       key_i = xxh3_64(uint32le(tokens of block i) + extras[i], seed=key_{i-1}); key_{-1} = parent_key
 *       tokens: a bytes-like object of packed uint32 ids, or a list/tuple of ints (packed here;
 *       ValueError for an id outside [0, 2**32), TypeError for a non-int). extras: None, or one
 *       bytes-or-None per block (the msgpack-encoded extra keys).
 *
 *   match(blocks, keys, owners) -> dict | None
 *       Per owner, the number of leading keys whose mask (blocks[key], bit i = owners[i]) has the
 *       owner's bit set without a break. None when a mask does not fit 64 bits (more than 64
 *       replica slots): the caller then uses the Python match.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

/* Packs ``n`` ids of a list/tuple as little-endian uint32 into ``out``. Returns -1 with an
 * exception set on a bad id. */
static int pack_ids(PyObject *seq, Py_ssize_t n, uint32_t *out) {
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "token ids must be ints; got %.80s at position %zd",
                         Py_TYPE(item)->tp_name, i);
            return -1;
        }
        unsigned long v = PyLong_AsUnsignedLong(item);
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > 0xFFFFFFFFUL) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "token ids must be in [0, 2**32); got %R at position %zd",
                         item, i);
            return -1;
        }
        uint32_t u = (uint32_t)v;
#if PY_BIG_ENDIAN
        u = __builtin_bswap32(u);
#endif
        out[i] = u;
    }
    return 0;
}

static PyObject *chain_keys(PyObject *self, PyObject *args) {
    PyObject *tokens, *extras;
    Py_ssize_t num_blocks, block_size;
    unsigned long long parent;
    if (!PyArg_ParseTuple(args, "OnnKO", &tokens, &num_blocks, &block_size, &parent, &extras))
        return NULL;
    if (num_blocks < 0 || block_size <= 0) {
        PyErr_Format(PyExc_ValueError, "need num_blocks >= 0 and block_size > 0; got %zd, %zd",
                     num_blocks, block_size);
        return NULL;
    }
    Py_ssize_t n_ids = num_blocks * block_size, stride = 4 * block_size;
    if (extras != Py_None && (!PyList_Check(extras) || PyList_GET_SIZE(extras) < num_blocks)) {
        PyErr_SetString(PyExc_TypeError, "extras must be None or a list with one entry per block");
        return NULL;
    }

    Py_buffer view = {0};
    PyObject *seq = NULL;
    uint32_t *packed = NULL;
    const char *data;
    if (PyObject_CheckBuffer(tokens)) {
        if (PyObject_GetBuffer(tokens, &view, PyBUF_SIMPLE) < 0) return NULL;
        if (view.len < n_ids * 4) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "token bytes hold %zd ids; %zd blocks of %zd need %zd",
                         view.len / 4, num_blocks, block_size, n_ids);
            return NULL;
        }
        data = (const char *)view.buf;
    } else {
        seq = PySequence_Fast(tokens, "tokens must be bytes or a list of token ids");
        if (seq == NULL) return NULL;
        if (PySequence_Fast_GET_SIZE(seq) < n_ids) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "got %zd token ids; %zd blocks of %zd need %zd",
                         PySequence_Fast_GET_SIZE(seq), num_blocks, block_size, n_ids);
            return NULL;
        }
        packed = PyMem_Malloc(n_ids ? n_ids * 4 : 4);  /* [n_ids] uint32, little-endian */
        if (packed == NULL) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        if (pack_ids(seq, n_ids, packed) < 0) {
            PyMem_Free(packed);
            Py_DECREF(seq);
            return NULL;
        }
        data = (const char *)packed;
    }

    PyObject *out = PyList_New(num_blocks);
    XXH64_hash_t key = (XXH64_hash_t)parent;
    XXH3_state_t state;
    for (Py_ssize_t i = 0; out != NULL && i < num_blocks; i++) {
        const char *block = data + i * stride;
        PyObject *extra = extras == Py_None ? Py_None : PyList_GET_ITEM(extras, i);
        if (extra == Py_None) {
            key = XXH3_64bits_withSeed(block, (size_t)stride, key);
        } else if (PyBytes_Check(extra)) {
            /* streaming over (block, extra) equals the one-shot hash of their concatenation */
            XXH3_64bits_reset_withSeed(&state, key);
            XXH3_64bits_update(&state, block, (size_t)stride);
            XXH3_64bits_update(&state, PyBytes_AS_STRING(extra), (size_t)PyBytes_GET_SIZE(extra));
            key = XXH3_64bits_digest(&state);
        } else {
            PyErr_SetString(PyExc_TypeError, "each extras entry must be bytes or None");
            Py_CLEAR(out);
            break;
        }
        PyObject *k = PyLong_FromUnsignedLongLong(key);
        if (k == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, k);
    }
    if (packed != NULL) PyMem_Free(packed);
    Py_XDECREF(seq);
    if (view.obj != NULL) PyBuffer_Release(&view);
    return out;
}

/* out[owners[slot]] = end for every set bit of ``bits``, lowest slot first. */
static int credit(PyObject *out, PyObject *owners, uint64_t bits, Py_ssize_t end) {
    if (!bits) return 0;
    PyObject *value = PyLong_FromSsize_t(end);
    if (value == NULL) return -1;
    Py_ssize_t num_owners = PyList_GET_SIZE(owners);
    int rc = 0;
    while (bits) {
        int slot = __builtin_ctzll(bits);
        bits &= bits - 1;
        if (slot >= num_owners) {
            PyErr_Format(PyExc_RuntimeError, "index mask names slot %d but only %zd slots exist",
                         slot, num_owners);
            rc = -1;
            break;
        }
        if (PyDict_SetItem(out, PyList_GET_ITEM(owners, slot), value) < 0) {
            rc = -1;
            break;
        }
    }
    Py_DECREF(value);
    return rc;
}

static PyObject *match(PyObject *self, PyObject *args) {
    PyObject *blocks, *keys, *owners;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyDict_Type, &blocks, &keys, &PyList_Type, &owners))
        return NULL;
    PyObject *seq = PySequence_Fast(keys, "keys must be a list of router keys");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyDict_New();
    if (out == NULL) goto fail;

    uint64_t held = ~(uint64_t)0;  /* replicas holding every block so far */
    PyObject *last_obj = NULL;      /* masks come in runs, often the very same int object */
    uint64_t last_mask = 0;
    Py_ssize_t end = 0;
    for (; end < n; end++) {
        PyObject *m = PyDict_GetItemWithError(blocks, items[end]);
        uint64_t mask;
        if (m == NULL) {
            if (PyErr_Occurred()) goto fail;
            mask = 0;
        } else if (m == last_obj) {
            mask = last_mask;
        } else {
            mask = PyLong_AsUnsignedLongLong(m);
            if (mask == (uint64_t)-1 && PyErr_Occurred()) {  /* wider than 64 slots */
                PyErr_Clear();
                Py_DECREF(out);
                Py_DECREF(seq);
                Py_RETURN_NONE;
            }
            last_obj = m;
            last_mask = mask;
        }
        uint64_t now_held = held & mask;
        if (end && credit(out, owners, held & ~now_held, end) < 0) goto fail;
        if (!now_held) {
            Py_DECREF(seq);
            return out;
        }
        held = now_held;
    }
    if (end && credit(out, owners, held, end) < 0) goto fail;
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain_keys", chain_keys, METH_VARARGS,
     "chain_keys(tokens, num_blocks, block_size, parent_key, extras) -> list of chained xxh3_64 keys"},
    {"match", match, METH_VARARGS,
     "match(blocks, keys, owners) -> {owner: leading blocks held}, or None if masks exceed 64 bits"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                    "The router's key chain and prefix match in C.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModule_Create(&module); }
