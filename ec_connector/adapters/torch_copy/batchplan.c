/* The CUDA engine's batch plan, compiled: validate a batch's runs, join the touching ones, and lay
 * out the copy-engine copies and the copy kernel's runs, in one call with no allocation.
 *
 * The Python it replaces (numpy over the whole batch) cost 20-60 µs per batch of 32 entries on the
 * engine's step thread; this costs well under a microsecond per run. Loaded with ctypes
 * (batchplan.py), so it needs no Python headers; built on first use with the C compiler that
 * Triton's own launchers need on any CUDA machine.
 *
 * Units: blocks (region rows) for starts and lengths, bytes for addresses and sizes. A copy's
 * runs are its entry's extents, (start, length) int64 pairs, the copies' pairs back to back.
 */
#include <stdint.h>

/* io[] slots: inputs the caller sets, then outputs written here (names mirrored in batchplan.py) */
enum {
    IN_COPIES, IN_RUNS, IN_CAPACITY, IN_NUM_BLOCKS, IN_ROW_BYTES, IN_HOST, IN_DENSE,
    IN_ITEM_BYTES, IN_BIG_ROWS, IN_FEW_RUNS, IN_MIXED_MIN_RUNS, IN_BASE_ALIGN, IN_SAVE,
    OUT_BAD_COPY, OUT_TOTAL_ROWS, OUT_DMA, OUT_KERNEL, OUT_KERNEL_ROWS, OUT_WORD, OUT_VEC,
    OUT_DELTA, IO_SLOTS = 32
};

/* the workspace: SECTIONS int64 columns of IN_CAPACITY values each, in this order */
enum { W_DMA_DST, W_DMA_SRC, W_DMA_SIZE, W_TABLE, W_TABLE2, W_TABLE3, W_START, W_LENGTH, W_FIRST,
       W_AT, W_BASE, SECTIONS };

/* the copy kernel takes up to INLINE_RUNS runs as arguments (kernels.py) */
#define INLINE_RUNS 16

enum { OK = 0, BAD_COVER = 1, BAD_BOUNDS = 2, BAD_CAPACITY = 3 };

int64_t ec_plan_sections(void) { return SECTIONS; }
int64_t ec_plan_io_slots(void) { return IO_SLOTS; }
int64_t ec_plan_inline_runs(void) { return INLINE_RUNS; }

/* (word bytes, words per 16-byte access) for addresses and sizes all multiples of `align` */
static void word_for(int64_t align, int64_t *word, int64_t *vec) {
    int64_t a = align ? (align & -align) : 16;
    if (a > 16) a = 16;
    *word = a < 8 ? a : 8;
    *vec = a / *word;
}

/* Plan one batch. `packed`: IN_RUNS (start, length) pairs; `rows`, `counts`: per copy, its rows and
 * its number of runs; saves also pass `pointers` (each payload's first row) and `offsets` (each
 * payload's storage offset in elements of IN_ITEM_BYTES), loads put their rows back to back from
 * IN_DENSE. Returns OK or the first problem (OUT_BAD_COPY names the copy); on a problem nothing
 * but io[] is meaningful. The caller makes the workspace SECTIONS * IN_CAPACITY values long and
 * IN_CAPACITY at least IN_RUNS. */
int64_t ec_plan_batch(int64_t *io, int64_t *ws, const int64_t *packed, const int64_t *rows,
                      const int64_t *counts, const int64_t *pointers, const int64_t *offsets) {
    const int64_t n_copies = io[IN_COPIES], n_runs = io[IN_RUNS], cap = io[IN_CAPACITY];
    const int64_t num_blocks = io[IN_NUM_BLOCKS], rb = io[IN_ROW_BYTES], host = io[IN_HOST];
    const int64_t big = io[IN_BIG_ROWS], save = io[IN_SAVE];
    int64_t *start = ws + W_START * cap, *length = ws + W_LENGTH * cap, *first = ws + W_FIRST * cap;
    int64_t *at = ws + W_AT * cap, *base = ws + W_BASE * cap;

    io[OUT_BAD_COPY] = -1;
    if (n_runs > cap) return BAD_CAPACITY;

    /* 1. validate every copy, and join each run into the one before it where both the region
     *    blocks and the dense bytes continue it (saves: only within one payload's storage) */
    const int join = n_runs > io[IN_FEW_RUNS];
    int64_t n = 0, total = 0, r = 0, last_copy = -1;
    for (int64_t c = 0; c < n_copies; c++) {
        const int64_t dense0 = save ? pointers[c] : io[IN_DENSE] + total * rb;
        const int64_t storage = save ? pointers[c] - offsets[c] * io[IN_ITEM_BYTES] : 0;
        int64_t covered = 0;
        if (counts[c] < 1 || r + counts[c] > n_runs) {
            io[OUT_BAD_COPY] = c;
            return BAD_COVER;
        }
        for (int64_t k = 0; k < counts[c]; k++, r++) {
            const int64_t s = packed[2 * r], len = packed[2 * r + 1];
            if (s < 0 || len < 1 || s > num_blocks - len) {
                io[OUT_BAD_COPY] = c;
                return BAD_BOUNDS;
            }
            const int64_t a = dense0 + covered * rb;
            if (join && n > 0 && start[n - 1] + length[n - 1] == s &&
                at[n - 1] + length[n - 1] * rb == a && (last_copy == c || base[n - 1] == storage)) {
                length[n - 1] += len;
            } else {
                start[n] = s;
                length[n] = len;
                first[n] = total + covered;
                at[n] = a;
                base[n] = storage;
                n++;
            }
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
     *    (IN_FEW_RUNS runs, or IN_MIXED_MIN_RUNS with a long one) wholly to the copy engines */
    int64_t n_long = 0;
    if (big >= 0)
        for (int64_t i = 0; i < n; i++) n_long += length[i] >= big;
    int all_dma = 0, all_kernel = 0;
    if (n == 0 || big < 0) {
        all_kernel = 1;
    } else if (n <= io[IN_FEW_RUNS] || n_long == n || (n_long && n <= io[IN_MIXED_MIN_RUNS])) {
        all_dma = 1;
    } else if (n_long == 0) {
        all_kernel = 1;
    }

    /* 3. the copy engines' copies: (dst, src, bytes) */
    int64_t *dst = ws + W_DMA_DST * cap, *src = ws + W_DMA_SRC * cap, *size = ws + W_DMA_SIZE * cap;
    int64_t n_dma = 0;
    if (!all_kernel) {
        for (int64_t i = 0; i < n; i++) {
            if (!all_dma && length[i] < big) continue;
            const int64_t h = host + start[i] * rb;
            dst[n_dma] = save ? h : at[i];
            src[n_dma] = save ? at[i] : h;
            size[n_dma] = length[i] * rb;
            n_dma++;
        }
    }
    io[OUT_DMA] = n_dma;

    /* 4. the kernel's runs, packed to the front of the joined columns, rows renumbered back to back */
    int64_t n_k = 0, k_rows = 0, or_at = 0;
    if (!all_dma) {
        for (int64_t i = 0; i < n; i++) {
            if (!all_kernel && length[i] >= big) continue;
            start[n_k] = start[i];
            length[n_k] = length[i];
            at[n_k] = at[i];
            first[n_k] = k_rows;
            or_at |= at[i];
            k_rows += length[i];
            n_k++;
        }
    }
    io[OUT_KERNEL] = n_k;
    io[OUT_KERNEL_ROWS] = k_rows;
    io[OUT_DELTA] = 0;
    if (n_k == 0) return OK;

    /* the kernel's dense tensor is the first payload (saves) or the batch's output (loads); every
     * address it touches decides the widest common access */
    const int64_t dense_base = save ? pointers[0] : io[IN_DENSE];
    int64_t word, vec;
    word_for(io[IN_BASE_ALIGN] | dense_base | (save ? or_at : 0), &word, &vec);
    io[OUT_WORD] = word;
    io[OUT_VEC] = vec;
    int64_t *table = ws + W_TABLE * cap;
    if (n_k <= INLINE_RUNS) {
        /* inline arguments: first rows of runs 1..15, starts 0..15, dense word offsets 0..15 */
        for (int64_t i = 1; i < INLINE_RUNS; i++) table[i - 1] = i < n_k ? first[i] : k_rows;
        for (int64_t i = 0; i < INLINE_RUNS; i++) {
            table[INLINE_RUNS - 1 + i] = i < n_k ? start[i] : 0;
            table[2 * INLINE_RUNS - 1 + i] = i < n_k ? (at[i] - dense_base) / word : 0;
        }
        return OK;
    }
    /* the staged table: columns first, start, delta of n_k values each, back to back; the kernel
     * puts row r of run i at dense word r * row_words + delta[i] */
    const int64_t row_words = rb / word;
    int64_t any_delta = 0;
    for (int64_t i = 0; i < n_k; i++) {
        const int64_t delta = (at[i] - dense_base) / word - first[i] * row_words;
        table[i] = first[i];
        table[n_k + i] = start[i];
        table[2 * n_k + i] = delta;
        any_delta |= delta != 0;
    }
    io[OUT_DELTA] = any_delta;
    return OK;
}
