"""Decode GGUF string arrays (u64 little-endian length + UTF-8 bytes, repeated) in one C pass.

A vocabulary holds up to a few hundred thousand such strings; a Python loop takes ~120 ms for
Gemma's 262,144 tokens, this loop a small fraction of that. Invalid UTF-8 is kept losslessly with
``surrogateescape`` so that a writer can reproduce the bytes.
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t


cdef inline uint64_t _load_u64_le(const unsigned char *p) noexcept nogil:
    cdef uint64_t value = 0
    cdef int k
    for k in range(7, -1, -1):
        value = (value << 8) | p[k]
    return value


def decode_string_array(const unsigned char[::1] buf, Py_ssize_t offset, Py_ssize_t count):
    """Decode ``count`` consecutive GGUF strings of ``buf`` starting at byte ``offset``.

    Returns
    -------
    (list[str] | None, int)
        The strings and the offset just past the last one; or ``None`` and the offset of the
        first length field whose string does not fit in ``buf`` (the caller reports it).
    """
    cdef Py_ssize_t size = buf.shape[0]
    cdef Py_ssize_t i
    cdef uint64_t length
    cdef const unsigned char *data
    if offset < 0 or offset > size or count < 0:
        raise ValueError(f"bad offset {offset} or count {count} for a buffer of {size} bytes")
    if count == 0:
        return [], offset
    data = &buf[0]
    # slots not yet filled stay NULL, which a list frees safely if we give up half-way
    strings = PyList_New(count)
    for i in range(count):
        if size - offset < 8:
            return None, offset
        length = _load_u64_le(data + offset)
        if length > <uint64_t>(size - offset - 8):
            return None, offset
        offset += 8
        text = PyUnicode_DecodeUTF8(<const char *>(data + offset), <Py_ssize_t>length,
                                    "surrogateescape")
        Py_INCREF(text)  # PyList_SET_ITEM steals a reference
        PyList_SET_ITEM(strings, i, text)
        offset += <Py_ssize_t>length
    return strings, offset
