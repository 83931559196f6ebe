/* Queueing one copy-engine batch on a copy stream: the stream operations the save launcher's thread
 * (launcher.c) and the step thread's one-call launch (batchplan.c) both make, in the same order.
 *
 * The CUDA runtime's entry points come in as addresses (cudart.py reads them from the library torch
 * loaded), so tests can pass their own and no CUDA header is needed.
 */
#ifndef EC_QUEUE_H
#define EC_QUEUE_H

#include <stddef.h>
#include <stdint.h>

typedef int (*ec_wait_fn)(void *stream, void *event, unsigned flags);
typedef int (*ec_record_fn)(void *event, void *stream);
typedef int (*ec_memcpy_fn)(void *dst, const void *src, size_t n, int kind, void *stream);
/* cudaMemcpyBatchAsync: CUDA 13 has no failIdx argument, 12.8-12.9 have one before the stream */
typedef int (*ec_batch13_fn)(void *dsts, void *srcs, void *sizes, size_t count, void *attrs,
                             void *attr_index, size_t n_attrs, void *stream);
typedef int (*ec_batch12_fn)(void *dsts, void *srcs, void *sizes, size_t count, void *attrs,
                             void *attr_index, size_t n_attrs, size_t *fail_index, void *stream);

/* which call failed (the Python sides name them) */
enum {
    EC_CALL_WAIT = 1,   /* cudaStreamWaitEvent: the copy stream on the fence */
    EC_CALL_START = 2,  /* cudaEventRecord: start */
    EC_CALL_COPY = 3,   /* the copies */
    EC_CALL_END = 4,    /* cudaEventRecord: end */
    EC_CALL_DEVICE = 5, /* cudaSetDevice (the launcher thread's device) */
    EC_CALL_FENCE = 6,  /* cudaEventRecord: the fence, on the caller's stream */
    EC_CALL_JOIN = 7,   /* cudaStreamWaitEvent: the caller's stream on the end event */
};
enum { EC_MEMCPY_DEFAULT = 4 };

/* The runtime's entry points and what a batch call takes besides its columns, as int64 values in
 * this order (cudart.CudaRuntime.driver_table). `batch` 0: one cudaMemcpyAsync per copy. */
typedef struct {
    int64_t wait, record, memcpy1, batch, batch_has_fail_index, batch_max, attr_index;
} ec_driver_t;

/* On `stream`: wait for `fence` (none when NULL), record `start`, copy `count` (dst, src, size) in
 * order (batch calls of at most batch_max copies, with the attributes at `attrs`), record `end`.
 * Returns 0 or the CUDA error, with the failing call in *call. */
static inline int ec_queue_copies(const ec_driver_t *d, void *stream, void *fence, void *start,
                                  void *end, const int64_t *dst, const int64_t *src,
                                  const int64_t *size, int64_t count, void *attrs, int64_t *call) {
    const ec_wait_fn wait = (ec_wait_fn)(intptr_t)d->wait;
    const ec_record_fn record = (ec_record_fn)(intptr_t)d->record;
    int err;
    *call = EC_CALL_WAIT;
    if (fence && (err = wait(stream, fence, 0))) return err;
    *call = EC_CALL_START;
    if ((err = record(start, stream))) return err;
    *call = EC_CALL_COPY;
    if (count == 1 || !d->batch) {
        const ec_memcpy_fn memcpy1 = (ec_memcpy_fn)(intptr_t)d->memcpy1;
        for (int64_t i = 0; i < count; i++)
            if ((err = memcpy1((void *)(intptr_t)dst[i], (const void *)(intptr_t)src[i],
                               (size_t)size[i], EC_MEMCPY_DEFAULT, stream)))
                return err;
    } else {
        void *attr_index = (void *)(intptr_t)d->attr_index;
        for (int64_t first = 0; first < count; first += d->batch_max) {
            const int64_t n = count - first < d->batch_max ? count - first : d->batch_max;
            if (d->batch_has_fail_index) {
                size_t fail = 0;
                err = ((ec_batch12_fn)(intptr_t)d->batch)((void *)(dst + first), (void *)(src + first),
                                                          (void *)(size + first), (size_t)n, attrs,
                                                          attr_index, 1, &fail, stream);
            } else {
                err = ((ec_batch13_fn)(intptr_t)d->batch)((void *)(dst + first), (void *)(src + first),
                                                          (void *)(size + first), (size_t)n, attrs,
                                                          attr_index, 1, stream);
            }
            if (err) return err;
        }
    }
    *call = EC_CALL_END;
    return record(end, stream);
}

#endif
