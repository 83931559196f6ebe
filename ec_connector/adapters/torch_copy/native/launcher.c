/* The save launcher: a native thread that hands planned copy-engine batches to the CUDA driver, off
 * the engine's step thread.
 *
 * The driver takes ~0.7-1.5 µs of host time per copy inside cudaMemcpyBatchAsync (H200), about
 * half of what a save of 32 aged entries costs the step thread. A save needs nothing
 * back from the driver before the step goes on (nobody waits on the region's bytes in stream
 * order), so the step thread records a fence on its stream, copies the batch's three columns into a
 * job here and returns; this thread queues, on the job's copy stream, the wait for the fence, the
 * start event, the copies (at most `batch_max` per call, in order) and the end event: queue.h's
 * sequence, which batchplan.c makes on the step thread for every other copy-engine batch. Loads stay
 * on the step thread: the caller's stream must wait on their end event before the step goes on.
 *
 * Jobs run in submission order. The first failing CUDA call is recorded (its job, call and error)
 * and every later job is skipped; the Python side raises it at its next look. No Python headers:
 * loaded with ctypes (launcher.py), the CUDA entry points passed in as addresses, so tests can pass
 * their own.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "queue.h"

typedef int (*set_device_fn)(int device);

typedef struct {
    int64_t stream, fence, start, end, count, capacity;
    int64_t *columns; /* dst[capacity], src[capacity], size[capacity] */
} job_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, room;
    pthread_t thread;
    int started, stop;
    job_t *jobs;
    int64_t slots, submitted; /* job s lives in jobs[s % slots] */
    _Atomic int64_t done;     /* jobs 0..done-1 have been handled (queued or skipped) */
    _Atomic int64_t error_job; /* -1 until a job fails; set before `done` passes it */
    int64_t error_call, error_code;
    int64_t device;
    set_device_fn set_device;
    ec_driver_t driver;
    void *attrs;
} launcher_t;

static int run_job(launcher_t *l, job_t *j, int64_t *call) {
    const int64_t *dst = j->columns, *src = dst + j->capacity, *size = src + j->capacity;
    return ec_queue_copies(&l->driver, (void *)(intptr_t)j->stream, (void *)(intptr_t)j->fence,
                           (void *)(intptr_t)j->start, (void *)(intptr_t)j->end, dst, src, size,
                           j->count, l->attrs, call);
}

static void *serve(void *arg) {
    launcher_t *l = arg;
    int err = l->set_device((int)l->device); /* the streams' device, current in this thread too */
    pthread_mutex_lock(&l->mu);
    if (err) {
        l->error_job = 0;
        l->error_call = EC_CALL_DEVICE;
        l->error_code = err;
    }
    for (;;) {
        int64_t next = atomic_load(&l->done);
        while (next == l->submitted && !l->stop) pthread_cond_wait(&l->work, &l->mu);
        if (next == l->submitted) break; /* stopping, nothing left */
        job_t *j = &l->jobs[next % l->slots];
        int failed = l->error_job >= 0;
        pthread_mutex_unlock(&l->mu);
        int64_t call = 0;
        err = failed ? 0 : run_job(l, j, &call);
        pthread_mutex_lock(&l->mu);
        if (err) {
            l->error_job = next;
            l->error_call = call;
            l->error_code = err;
        }
        atomic_store(&l->done, next + 1);
        pthread_cond_broadcast(&l->room);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* A launcher with `slots` job slots for the streams of CUDA device `device`; NULL when out of
 * memory or the thread cannot start. `batch` may be NULL (copies go one cudaMemcpyAsync at a
 * time). */
void *ec_launcher_new(int64_t slots, int64_t device, void *set_device, void *wait, void *record,
                      void *memcpy1, void *batch, int64_t batch_has_fail_index, void *attrs,
                      void *attr_index, int64_t batch_max) {
    if (slots < 1 || batch_max < 1) return NULL;
    launcher_t *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->jobs = calloc((size_t)slots, sizeof *l->jobs);
    if (!l->jobs) {
        free(l->jobs);
        free(l);
        return NULL;
    }
    l->slots = slots;
    l->error_job = -1;
    l->device = device;
    l->set_device = (set_device_fn)set_device;
    l->driver = (ec_driver_t){(int64_t)(intptr_t)wait,  (int64_t)(intptr_t)record,
                              (int64_t)(intptr_t)memcpy1, (int64_t)(intptr_t)batch,
                              batch_has_fail_index,      batch_max,
                              (int64_t)(intptr_t)attr_index};
    l->attrs = attrs;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->room, NULL);
    if (pthread_create(&l->thread, NULL, serve, l)) {
        free(l->jobs);
        free(l);
        return NULL;
    }
    l->started = 1;
    return l;
}

/* Queue a job: copy `count` (dst, src, size) from the three int64 columns, then wake the thread.
 * Returns the job's number (0, 1, ...), -1 when out of memory, -2 when stopped. Waits while every
 * slot holds a job not yet handled. */
int64_t ec_launcher_submit(void *handle, int64_t stream, int64_t fence, int64_t start, int64_t end,
                           const int64_t *dst, const int64_t *src, const int64_t *size,
                           int64_t count) {
    launcher_t *l = handle;
    pthread_mutex_lock(&l->mu);
    while (l->submitted - atomic_load(&l->done) >= l->slots && !l->stop)
        pthread_cond_wait(&l->room, &l->mu);
    if (l->stop) {
        pthread_mutex_unlock(&l->mu);
        return -2;
    }
    /* the slot is free: its job was handled, and only this (submitting) side writes slots */
    job_t *j = &l->jobs[l->submitted % l->slots];
    pthread_mutex_unlock(&l->mu);
    if (count > j->capacity) {
        int64_t capacity = count < 64 ? 64 : count;
        int64_t *columns = malloc((size_t)(3 * capacity) * sizeof *columns);
        if (!columns) return -1;
        free(j->columns);
        j->columns = columns;
        j->capacity = capacity;
    }
    memcpy(j->columns, dst, (size_t)count * sizeof *dst);
    memcpy(j->columns + j->capacity, src, (size_t)count * sizeof *src);
    memcpy(j->columns + 2 * j->capacity, size, (size_t)count * sizeof *size);
    j->stream = stream;
    j->fence = fence;
    j->start = start;
    j->end = end;
    j->count = count;
    pthread_mutex_lock(&l->mu);
    int64_t number = l->submitted++;
    pthread_cond_signal(&l->work);
    pthread_mutex_unlock(&l->mu);
    return number;
}

/* How many jobs have been handled (every job below this number has been queued on its stream), or
 * -1 once one has failed (ec_launcher_error says which). */
int64_t ec_launcher_done(void *handle) {
    launcher_t *l = handle;
    int64_t done = atomic_load(&l->done);
    return atomic_load(&l->error_job) >= 0 ? -1 : done;
}

/* The first failure, as (job, call, CUDA error) into out[3]; job -1 when none. */
void ec_launcher_error(void *handle, int64_t *out) {
    launcher_t *l = handle;
    pthread_mutex_lock(&l->mu);
    out[0] = l->error_job;
    out[1] = l->error_call;
    out[2] = l->error_code;
    pthread_mutex_unlock(&l->mu);
}

/* Wait until every submitted job has been handled. */
void ec_launcher_drain(void *handle) {
    launcher_t *l = handle;
    pthread_mutex_lock(&l->mu);
    while (atomic_load(&l->done) < l->submitted) pthread_cond_wait(&l->room, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

/* Handle what is queued, stop the thread and free everything. */
void ec_launcher_free(void *handle) {
    launcher_t *l = handle;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->work);
    pthread_cond_broadcast(&l->room);
    pthread_mutex_unlock(&l->mu);
    if (l->started) pthread_join(l->thread, NULL);
    for (int64_t i = 0; i < l->slots; i++) free(l->jobs[i].columns);
    free(l->jobs);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->room);
    free(l);
}
