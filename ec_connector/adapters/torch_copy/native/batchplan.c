/* The CUDA engine's batch plan, compiled: validate a batch's runs, join the touching ones, and lay
 * out the copy-engine copies and the copy kernel's runs, in one call with no allocation.
 *
 * The Python it replaces (numpy over the whole batch) cost 20-60 µs per batch of 32 entries on the
 * engine's step thread; this costs well under a microsecond per run. `ec_plan_copies` reads the
 * batch from the copies themselves (their `packed` extents and `rows`), so the step thread builds
 * no list, buffer or array for it. Built on first use with the C compiler and against the Python
 * headers that Triton's own launchers need on any CUDA machine; loaded with ctypes.PyDLL (the GIL
 * held, as the Python API needs) by batchplan.py.
 *
 * Units: blocks (region rows) for starts and lengths, bytes for addresses and sizes. A copy's
 * runs are its entry's extents, (start, length) int64 pairs, the copies' pairs back to back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "queue.h"

/* io[] slots: inputs the caller sets, then outputs written here (names mirrored in batchplan.py;
 * tests/adapters/test_batch_plan_slots.py compares the two lists) */
enum {
    IN_COPIES, IN_RUNS, IN_CAPACITY, IN_NUM_BLOCKS, IN_ROW_BYTES, IN_HOST, IN_DENSE,
    IN_ITEM_BYTES, IN_BIG_ROWS, IN_FEW_RUNS, IN_MIXED_MIN_RUNS, IN_BASE_ALIGN, IN_SAVE, IN_FEW_SHORT,
    OUT_BAD_COPY, OUT_TOTAL_ROWS, OUT_DMA, OUT_KERNEL, OUT_KERNEL_ROWS, OUT_WORD, OUT_VEC,
    OUT_DELTA, OUT_QUEUED, OUT_CALL, OUT_CUDA_ERROR,
    /* ec_plan_queue's: the driver (an ec_driver_t's address) and the batch attributes of loads and
     * saves, set once; the streams and events of each batch, set per call */
    IN_DRIVER, IN_LOAD_ATTRS, IN_SAVE_ATTRS, IN_CALLER, IN_STREAM, IN_FENCE, IN_START, IN_END,
    /* ec_plan_copies': where the workspace and the scratch are, how many copies the scratch holds,
     * the short-run allowances (IN_FEW_SHORT is the larger of IN_FEW_SHORT_MIN and
     * IN_SHORT_PER_COPY per copy), and the room a batch needed when it did not fit */
    IN_WORKSPACE, IN_SCRATCH, IN_SCRATCH_COPIES, IN_FEW_SHORT_MIN, IN_SHORT_PER_COPY,
    OUT_NEED_RUNS, OUT_NEED_COPIES,
    IO_SLOTS = 48
};

/* the workspace: SECTIONS int64 columns of IN_CAPACITY values each, in this order; the joined runs
 * take the last columns as records (one run's fields side by side) */
typedef struct {
    int64_t start, length, first, at, storage;
} run_t;
enum { W_DMA_DST, W_DMA_SRC, W_DMA_SIZE, W_TABLE, W_TABLE2, W_TABLE3, W_RUNS,
       SECTIONS = W_RUNS + sizeof(run_t) / sizeof(int64_t) };

/* the copy kernel takes up to INLINE_RUNS runs as arguments (kernels.py) */
#define INLINE_RUNS 16

enum { OK = 0, BAD_COVER = 1, BAD_BOUNDS = 2, BAD_CAPACITY = 3 };

/* (word bytes, words per 16-byte access, log2 of the word) for addresses and sizes all multiples
 * of `align` */
static void word_for(int64_t align, int64_t *word, int64_t *vec, int *shift) {
    int64_t a = align ? (align & -align) : 16;
    if (a > 16) a = 16;
    *word = a < 8 ? a : 8;
    *vec = a / *word;
    *shift = *word == 8 ? 3 : *word == 4 ? 2 : *word == 2 ? 1 : 0;
}

int64_t ec_plan_sections(void) { return SECTIONS; }
int64_t ec_plan_io_slots(void) { return IO_SLOTS; }
int64_t ec_plan_inline_runs(void) { return INLINE_RUNS; }

/* the kernel's access for addresses all multiples of `align`: out[0] word bytes, out[1] words per
 * access (what the engine compiles its kernel variants for ahead of the first batch) */
void ec_plan_access(int64_t align, int64_t *out) {
    int shift;
    word_for(align, &out[0], &out[1], &shift);
}

/* Plan one batch. `packed`: IN_RUNS (start, length) pairs; `rows`, `counts`: per copy, its rows and
 * its number of runs; saves also pass `pointers` (each payload's first row) and `offsets` (each
 * payload's storage offset in elements of IN_ITEM_BYTES), loads put their rows back to back from
 * IN_DENSE. Returns OK or the first problem (OUT_BAD_COPY names the copy); on a problem nothing
 * but io[] is meaningful. The caller makes the workspace SECTIONS * IN_CAPACITY values long and
 * IN_CAPACITY at least IN_RUNS. */
static int64_t ec_plan_batch(int64_t *restrict io, int64_t *restrict ws, const int64_t *restrict packed,
                             const int64_t *restrict rows, const int64_t *restrict counts,
                             const int64_t *restrict pointers, const int64_t *restrict offsets) {
    const int64_t n_copies = io[IN_COPIES], n_runs = io[IN_RUNS], cap = io[IN_CAPACITY];
    const int64_t num_blocks = io[IN_NUM_BLOCKS], rb = io[IN_ROW_BYTES], host = io[IN_HOST];
    const int64_t big = io[IN_BIG_ROWS], save = io[IN_SAVE], dense = io[IN_DENSE];
    const int64_t item_bytes = io[IN_ITEM_BYTES];
    run_t *restrict run = (run_t *)(ws + W_RUNS * cap);

    io[OUT_BAD_COPY] = -1;
    if (n_runs > cap) return BAD_CAPACITY;

    /* 1. validate every copy, and join each run into the one before it where both the region
     *    blocks and the dense bytes continue it (saves: only within one payload's storage) */
    int64_t n = 0, total = 0, r = 0, last_copy = -1;
    int64_t end = -1, dense_end = -1; /* where the last joined run ends: region block, dense byte */
    for (int64_t c = 0; c < n_copies; c++) {
        const int64_t dense0 = save ? pointers[c] : dense + total * rb;
        const int64_t storage = save ? pointers[c] - offsets[c] * item_bytes : 0;
        const int64_t count = counts[c];
        int64_t covered = 0;
        if (count < 1 || r + count > n_runs) {
            io[OUT_BAD_COPY] = c;
            return BAD_COVER;
        }
        for (int64_t k = 0; k < count; k++, r++) {
            const int64_t s = packed[2 * r], len = packed[2 * r + 1];
            if (s < 0 || len < 1 || s > num_blocks - len) {
                io[OUT_BAD_COPY] = c;
                return BAD_BOUNDS;
            }
            const int64_t a = dense0 + covered * rb;
            if (s == end && a == dense_end && (last_copy == c || run[n - 1].storage == storage)) {
                run[n - 1].length += len;
            } else {
                run[n] = (run_t){s, len, total + covered, a, storage};
                n++;
            }
            end = s + len;
            dense_end = a + len * rb;
            last_copy = c;
            covered += len;
        }
        if (covered != rows[c]) {
            io[OUT_BAD_COPY] = c;
            return BAD_COVER;
        }
        total += covered;
    }
    if (r != n_runs) {
        io[OUT_BAD_COPY] = n_copies - 1;
        return BAD_COVER;
    }
    io[OUT_TOTAL_ROWS] = total;

    /* 2. long runs (>= big rows) to the copy engines, short ones to the kernel; small batches
     *    (IN_FEW_RUNS runs, or IN_MIXED_MIN_RUNS with a long one), and batches of long runs with at
     *    most IN_FEW_SHORT short ones, wholly to the copy engines */
    int64_t n_long = 0, long_rows = 0, or_all = 0, or_short = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t is_long = big >= 0 && run[i].length >= big;
        n_long += is_long;
        long_rows += is_long ? run[i].length : 0;
        or_all |= run[i].at;
        or_short |= is_long ? 0 : run[i].at;
    }
    int all_dma = 0, all_kernel = 0;
    if (n == 0 || big < 0) {
        all_kernel = 1;
    } else if (n <= io[IN_FEW_RUNS] || n_long == n
               || (n_long && (n <= io[IN_MIXED_MIN_RUNS] || n - n_long <= io[IN_FEW_SHORT]))) {
        all_dma = 1;
    } else if (n_long == 0) {
        all_kernel = 1;
    }
    const int64_t n_k = all_dma ? 0 : all_kernel ? n : n - n_long;
    const int64_t k_rows = all_dma ? 0 : all_kernel ? total : total - long_rows;
    io[OUT_DMA] = n - n_k;
    io[OUT_KERNEL] = n_k;
    io[OUT_KERNEL_ROWS] = k_rows;
    io[OUT_DELTA] = 0;

    /* the kernel's dense tensor is the first payload (saves) or the batch's output (loads); every
     * address it touches decides the widest common access */
    const int64_t dense_base = save ? pointers[0] : dense;
    int64_t word = 1, vec = 1;
    int shift = 0; /* dense offsets are exact multiples of the word: shifts, not divisions */
    if (n_k) {
        word_for(io[IN_BASE_ALIGN] | dense_base | (save ? (all_kernel ? or_all : or_short) : 0), &word,
                 &vec, &shift);
        io[OUT_WORD] = word;
        io[OUT_VEC] = vec;
    }

    /* 3. one pass: each run becomes a copy-engine copy (dst, src, bytes) or a kernel run, the
     *    kernel's rows renumbered back to back. Up to INLINE_RUNS kernel runs become its arguments
     *    (first rows of runs 1..15, starts 0..15, dense word offsets 0..15); more, the staged table:
     *    columns first, start, delta of n_k values each, back to back, the kernel putting row r of
     *    run i at dense word r * row_words + delta[i] */
    int64_t *dst = ws + W_DMA_DST * cap, *src = ws + W_DMA_SRC * cap, *size = ws + W_DMA_SIZE * cap;
    int64_t *table = ws + W_TABLE * cap;
    const int inline_args = n_k <= INLINE_RUNS;
    const int64_t row_words = rb / word;
    int64_t d = 0, k = 0, k_first = 0, any_delta = 0;
    for (int64_t i = 0; i < n; i++) {
        const run_t *x = &run[i];
        if (all_dma || (!all_kernel && x->length >= big)) {
            const int64_t h = host + x->start * rb;
            dst[d] = save ? h : x->at;
            src[d] = save ? x->at : h;
            size[d] = x->length * rb;
            d++;
            continue;
        }
        const int64_t offset = (x->at - dense_base) >> shift;
        if (inline_args) {
            if (k) table[k - 1] = k_first;
            table[INLINE_RUNS - 1 + k] = x->start;
            table[2 * INLINE_RUNS - 1 + k] = offset;
        } else {
            const int64_t delta = offset - k_first * row_words;
            table[k] = k_first;
            table[n_k + k] = x->start;
            table[2 * n_k + k] = delta;
            any_delta |= delta != 0;
        }
        k_first += x->length;
        k++;
    }
    if (n_k && inline_args) {
        for (int64_t j = n_k; j < INLINE_RUNS; j++) { /* runs past the last: empty, at the end */
            table[j - 1] = k_rows;
            table[INLINE_RUNS - 1 + j] = 0;
            table[2 * INLINE_RUNS - 1 + j] = 0;
        }
    }
    io[OUT_DELTA] = any_delta;
    return OK;
}

/* Plan one batch (as ec_plan_batch, same arguments) and, when it goes wholly to the copy engines,
 * queue it at once: record IN_FENCE on the IN_CALLER stream, then on the copy stream IN_STREAM wait
 * for it, record IN_START, make the copies (with the IN_LOAD_ATTRS or IN_SAVE_ATTRS batch
 * attributes) and record IN_END; a load's caller stream then waits for IN_END (what the caller
 * queues next sees the bytes). When IN_STREAM is the caller's own, the batch goes straight onto it
 * (start, copies, end): stream order alone puts it after the caller's earlier work and before its
 * later work, so the fence and the join are not needed. One call, its values in io[] rather than
 * arguments (each ctypes argument costs the step thread more than a slot), for what took a plan
 * and up to six runtime calls from Python. OUT_QUEUED says whether it queued (a batch with kernel
 * runs is only planned: the kernel is launched from Python); a failing CUDA call leaves its
 * EC_CALL_* in OUT_CALL and its error in OUT_CUDA_ERROR, and the calls after it are not made.
 * Returns what ec_plan_batch returns. */
static int64_t ec_plan_queue(int64_t *restrict io, int64_t *restrict ws, const int64_t *restrict packed,
                             const int64_t *restrict rows, const int64_t *restrict counts,
                             const int64_t *restrict pointers, const int64_t *restrict offsets) {
    io[OUT_QUEUED] = 0;
    io[OUT_CALL] = 0;
    io[OUT_CUDA_ERROR] = 0;
    const int64_t status = ec_plan_batch(io, ws, packed, rows, counts, pointers, offsets);
    if (status != OK || io[OUT_KERNEL]) return status;
    io[OUT_QUEUED] = 1;
    const ec_driver_t *driver = (const ec_driver_t *)(intptr_t)io[IN_DRIVER];
    const int load = !io[IN_SAVE];
    const int apart = io[IN_STREAM] != io[IN_CALLER]; /* on a copy stream of its own: fence, join */
    void *on = (void *)(intptr_t)io[IN_STREAM], *from = (void *)(intptr_t)io[IN_CALLER];
    void *fired = (void *)(intptr_t)io[IN_END], *after = apart ? (void *)(intptr_t)io[IN_FENCE] : NULL;
    void *attrs = (void *)(intptr_t)io[load ? IN_LOAD_ATTRS : IN_SAVE_ATTRS];
    const int64_t cap = io[IN_CAPACITY];
    int64_t call = EC_CALL_FENCE;
    int err = apart ? ((ec_record_fn)(intptr_t)driver->record)(after, from) : 0;
    if (!err)
        err = ec_queue_copies(driver, on, after, (void *)(intptr_t)io[IN_START], fired,
                              ws + W_DMA_DST * cap, ws + W_DMA_SRC * cap, ws + W_DMA_SIZE * cap,
                              io[OUT_DMA], attrs, &call);
    if (!err && load && apart) {
        call = EC_CALL_JOIN;
        err = ((ec_wait_fn)(intptr_t)driver->wait)(from, fired, 0);
    }
    if (err) {
        io[OUT_CALL] = call;
        io[OUT_CUDA_ERROR] = err;
    }
    return OK;
}

/* The batch `copies` (a tuple, list or other iterable of objects with `packed`, their extents as
 * int64 (start, length) pairs in a bytes object, and `rows`), planned (ec_plan_batch) or, with
 * `queue`, planned and queued (ec_plan_queue). Saves pass `pointers` and `offsets`, lists of one
 * int per copy; loads None. The copies' columns go to the scratch at IN_SCRATCH: rows, counts,
 * pointers and offsets of IN_SCRATCH_COPIES values each, then the runs, IN_CAPACITY pairs. A batch
 * that does not fit returns BAD_CAPACITY with the room it needs in OUT_NEED_RUNS and
 * OUT_NEED_COPIES; a value of the wrong type returns -1 with a Python exception set (which ctypes
 * raises). */
int64_t ec_plan_copies(int64_t *restrict io, PyObject *copies, PyObject *pointers, PyObject *offsets,
                       int64_t queue) {
    static PyObject *packed_name, *rows_name;
    if (!packed_name) {
        packed_name = PyUnicode_InternFromString("packed");
        rows_name = PyUnicode_InternFromString("rows");
        if (!packed_name || !rows_name) return -1;
    }
    /* a tuple (StepPlan's) is taken as it is; anything else is copied into one, so that nothing an
     * attribute read runs can change the batch under the loop */
    PyObject *seq = PyTuple_Check(copies) ? (Py_INCREF(copies), copies) : PySequence_Tuple(copies);
    if (!seq) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "a batch's copies must be a list or a tuple (or another iterable)");
        }
        return -1;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    const int save = pointers != Py_None;
    if (save && !(PyList_Check(pointers) && PyList_Check(offsets) && PyList_GET_SIZE(pointers) == n
                  && PyList_GET_SIZE(offsets) == n)) {
        PyErr_Format(PyExc_TypeError,
                     "a save's pointers and offsets must be lists of %zd ints, one per copy", n);
        Py_DECREF(seq);
        return -1;
    }
    const int64_t room = io[IN_SCRATCH_COPIES], cap = io[IN_CAPACITY];
    int64_t *restrict rows = (int64_t *)(intptr_t)io[IN_SCRATCH];
    int64_t *restrict counts = rows + room, *restrict at = rows + 2 * room, *restrict off = rows + 3 * room;
    int64_t *restrict packed = rows + 4 * room;
    const int fits_copies = n <= room;
    int64_t runs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyObject_GetAttr(items[i], packed_name);
        if (!p) goto fail;
        if (!PyBytes_Check(p) || PyBytes_GET_SIZE(p) % 16) {
            PyErr_Format(PyExc_TypeError, "copy %zd's packed extents are not int64 (start, length) pairs "
                         "in bytes; build the copy with pack_extents(extents) or without `packed`", i);
            Py_DECREF(p);
            goto fail;
        }
        const int64_t k = PyBytes_GET_SIZE(p) >> 4;
        if (fits_copies && runs + k <= cap) memcpy(packed + 2 * runs, PyBytes_AS_STRING(p), (size_t)k * 16);
        Py_DECREF(p);
        PyObject *r = PyObject_GetAttr(items[i], rows_name);
        if (!r) goto fail;
        const int64_t value = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (value == -1 && PyErr_Occurred()) goto fail;
        if (fits_copies) {
            rows[i] = value;
            counts[i] = k;
            if (save) {
                PyObject *a = PyList_GET_ITEM(pointers, i), *o = PyList_GET_ITEM(offsets, i);
                if (!PyLong_Check(a) || !PyLong_Check(o)) { /* exact ints: no __index__ to run */
                    PyErr_Format(PyExc_TypeError, "copy %zd's payload pointer and offset must be ints", i);
                    goto fail;
                }
                at[i] = PyLong_AsLongLong(a);
                off[i] = PyLong_AsLongLong(o);
                if (PyErr_Occurred()) goto fail;
            }
        }
        runs += k;
    }
    Py_DECREF(seq);
    if (!fits_copies || runs > cap) {
        io[OUT_NEED_RUNS] = runs;
        io[OUT_NEED_COPIES] = n;
        return BAD_CAPACITY;
    }
    io[IN_COPIES] = n;
    io[IN_RUNS] = runs;
    const int64_t per_copy = io[IN_SHORT_PER_COPY] * n;
    io[IN_FEW_SHORT] = per_copy > io[IN_FEW_SHORT_MIN] ? per_copy : io[IN_FEW_SHORT_MIN];
    int64_t *ws = (int64_t *)(intptr_t)io[IN_WORKSPACE];
    const int64_t *ptrs = save ? at : NULL, *offs = save ? off : NULL;
    return queue ? ec_plan_queue(io, ws, packed, rows, counts, ptrs, offs)
                 : ec_plan_batch(io, ws, packed, rows, counts, ptrs, offs);
fail:
    Py_DECREF(seq);
    return -1;
}
