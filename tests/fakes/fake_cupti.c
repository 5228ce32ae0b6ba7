/*
 * FAKE libcupti: stands in for CUPTI's activity API on machines without an NVIDIA GPU (CI), so max_profile's C
 * recorder (max_profile/collect/live/native/cupti_ring.c) runs for real against it. Not NVIDIA's library.
 *
 * It implements the calls the recorder resolves with dlsym, with the signatures and behaviour cupti_activity.h and
 * cupti_callbacks.h document (compiled against those headers, so the prototypes are checked):
 *   cuptiActivityRegisterCallbacks / Enable / Disable / FlushAll / GetNextRecord / GetNumDroppedRecords,
 *   cuptiActivityEnableDriverApi / EnableRuntimeApi, cuptiGetTimestamp (CLOCK_MONOTONIC ns), cuptiGetCallbackName,
 *   cuptiGetResultString, cuptiGetVersion, cuptiSubscribe / cuptiSubscribe_v2 / cuptiUnsubscribe,
 *   cuptiActivitySetAttribute (ZEROED_OUT_ACTIVITY_BUFFER: then every buffer handed over is checked to be zero; else the
 *   fake zeroes it, as CUPTI does).
 * Records are written into the client's buffers back to back, as CUPTI does: kernel records of the struct the
 * recorder was built with (MP_KERNEL_RECORD), launch-call records as CUpti_ActivityAPI. A full buffer is handed to
 * the client's completion callback from another thread (CUPTI's worker thread does that), then a new one requested.
 *
 * Test controls (not CUPTI): fake_emit(), fake_emit_unfinished(), fake_set_async(), fake_set_holder(), fake_stats(),
 * fake_set_repeated_graph_ids() (CUPTI 13.0's wrong graph-launch correlation ids, as modelled there).
 * Build: gcc -shared -fPIC -I<cuda>/include -DMP_KERNEL_RECORD=CUpti_ActivityKernel10 -o libfake_cupti.so fake_cupti.c -lpthread
 */
#include <cupti.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MP_KERNEL_RECORD
#define MP_KERNEL_RECORD CUpti_ActivityKernel10
#endif

static CUpti_BuffersCallbackRequestFunc requested_fn;
static CUpti_BuffersCallbackCompleteFunc completed_fn;
static int kernels_on, driver_on, subscribed, client_zeroes;
static uint8_t driver_call_on[CUPTI_DRIVER_TRACE_CBID_SIZE]; /* per driver call: its records on (the DRIVER kind on) */
static uint64_t api_switches; /* cuptiActivityEnableDriverApi / EnableRuntimeApi calls */
static uint64_t records_written; /* kernel and API records written into the client's buffers */
static uint64_t calls_intercepted; /* driver calls made while the DRIVER kind was on, recorded or not (CUPTI's cost) */
static uint64_t dirty_buffers; /* buffers handed over not zeroed although the client said it zeroes them */
static uint8_t *buffer;
static size_t buffer_size, buffer_used;
static uint32_t next_correlation = 1;
static int repeat_graph_ids;          /* fake_set_repeated_graph_ids */
static uint32_t repeated_graph_id;   /* the id every graph launch reuses while that is on (0: none taken yet) */
static char holder[64];
static uint64_t buffers_requested, buffers_completed, distinct_buffers, undersized_buffers;
static uint8_t *seen_buffers[1024];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *const kernel_names[] = {"gemv_split_k_bfloat16_256", "rms_norm_fused_residual", "mha_depth128_bfloat16"};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct {
    uint8_t *buffer;
    size_t size, valid;
} handoff_t;

static int async_mode, in_flight;
static pthread_mutex_t in_flight_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t in_flight_done = PTHREAD_COND_INITIALIZER;

static void *complete_on_worker(void *arg) {
    handoff_t *h = arg;
    completed_fn(NULL, 0, h->buffer, h->size, h->valid);
    if (async_mode) {
        free(h);
        pthread_mutex_lock(&in_flight_lock);
        in_flight--;
        pthread_cond_broadcast(&in_flight_done);
        pthread_mutex_unlock(&in_flight_lock);
    }
    return NULL;
}

/* hand the current buffer to the client from another thread, as CUPTI's worker thread does: waited for, or (async
 * mode) left running while the emitting thread goes on and asks for the next buffer, as with CUPTI */
static void complete_current(void) {
    if (!buffer) return;
    pthread_t t;
    if (async_mode) {
        handoff_t *h = malloc(sizeof *h);
        *h = (handoff_t){buffer, buffer_size, buffer_used};
        pthread_mutex_lock(&in_flight_lock);
        in_flight++;
        pthread_mutex_unlock(&in_flight_lock);
        pthread_create(&t, NULL, complete_on_worker, h);
        pthread_detach(t);
    } else {
        handoff_t h = {buffer, buffer_size, buffer_used};
        pthread_create(&t, NULL, complete_on_worker, &h);
        pthread_join(t, NULL);
    }
    buffers_completed++;
    buffer = NULL;
    buffer_size = buffer_used = 0;
}

static int ensure_space(size_t need) {
    if (buffer && buffer_used + need <= buffer_size) return 0;
    complete_current();
    size_t max_records = 0;
    requested_fn(&buffer, &buffer_size, &max_records);
    buffers_requested++;
    buffer_used = 0;
    if (!buffer || buffer_size < need) return -1;
    if (client_zeroes) { /* CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER = 1: the client hands zeroed buffers */
        for (size_t i = 0; i < buffer_size; i += 64)
            if (buffer[i]) { dirty_buffers++; break; }
    } else {
        memset(buffer, 0, buffer_size); /* as CUPTI does on the launching thread */
    }
    if (malloc_usable_size(buffer) < buffer_size) undersized_buffers++; /* claimed larger than allocated: CUPTI would overrun it */
    int known = 0;
    for (uint64_t i = 0; i < distinct_buffers && i < 1024; i++) known |= seen_buffers[i] == buffer;
    if (!known && distinct_buffers < 1024) seen_buffers[distinct_buffers++] = buffer;
    return 0;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req, CUpti_BuffersCallbackCompleteFunc comp) {
    requested_fn = req;
    completed_fn = comp;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) kernels_on = 1;
    if (kind == CUPTI_ACTIVITY_KIND_DRIVER) { /* every driver call recorded again (seen on the H200) */
        driver_on = 1;
        memset(driver_call_on, 1, sizeof driver_call_on);
    }
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) kernels_on = 0;
    if (kind == CUPTI_ACTIVITY_KIND_DRIVER) driver_on = 0;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    pthread_mutex_lock(&lock);
    if (buffer && buffer_used) complete_current();
    pthread_mutex_unlock(&lock);
    pthread_mutex_lock(&in_flight_lock);  /* a forced flush returns once every buffer was handed over */
    while (in_flight > 0) pthread_cond_wait(&in_flight_done, &in_flight_lock);
    pthread_mutex_unlock(&in_flight_lock);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **record) {
    uint8_t *at = *record ? (uint8_t *)*record : buf;
    if (*record) {
        CUpti_ActivityKind kind = (*record)->kind;
        at += kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ? sizeof(MP_KERNEL_RECORD) : sizeof(CUpti_ActivityAPI);
    }
    if (at >= buf + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)at;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *dropped) {
    (void)ctx; (void)stream;
    *dropped = 0;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
    api_switches++;
    if (cbid < CUPTI_DRIVER_TRACE_CBID_SIZE) driver_call_on[cbid] = enable != 0;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
    (void)cbid; (void)enable;
    api_switches++;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivitySetAttribute(CUpti_ActivityAttribute attr, size_t *size, void *value) {
    if (attr == CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER && size && *size == sizeof(uint8_t)) client_zeroes = *(uint8_t *)value != 0;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetTimestamp(uint64_t *timestamp) {
    *timestamp = now_ns();
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name) {
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) *name = "cuLaunchKernel";
    else if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch) *name = "cuGraphLaunch";
    else *name = "cuMemcpyHtoD_v2";
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
    *str = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "CUPTI_ERROR (fake)";
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetVersion(uint32_t *version) {
    *version = CUPTI_API_VERSION;
    return CUPTI_SUCCESS;
}

static void CUPTIAPI ignore_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
    (void)userdata; (void)domain; (void)cbid; (void)data;
}

CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata, CUpti_SubscriberParams *params) {
    (void)callback; (void)userdata;
    if (holder[0] || subscribed) {
        if (params && params->oldSubscriberName && params->oldSubscriberSize)
            snprintf(params->oldSubscriberName, params->oldSubscriberSize, "%s", holder[0] ? holder : "max_profile");
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    subscribed = 1;
    *subscriber = (CUpti_SubscriberHandle)(uintptr_t)ignore_callback;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata) {
    return cuptiSubscribe_v2(subscriber, callback, userdata, NULL);
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
    (void)subscriber;
    subscribed = 0;
    return CUPTI_SUCCESS;
}

/* --- test controls ------------------------------------------------------------------------------------------- */

/* a driver-API record (cuLaunchKernel / cuGraphLaunch, or another call) on thread 4242, 1 µs before the work it
 * launches; nothing when the DRIVER kind or that call is off */
static int write_launch(uint32_t cbid, uint64_t work_start_ns, uint32_t correlation) {
    if (driver_on) calls_intercepted++;
    if (!driver_on || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE || !driver_call_on[cbid]) return 0;
    if (ensure_space(sizeof(CUpti_ActivityAPI)) != 0) return -1;
    CUpti_ActivityAPI *api = (CUpti_ActivityAPI *)(buffer + buffer_used);
    memset(api, 0, sizeof *api);
    api->kind = CUPTI_ACTIVITY_KIND_DRIVER;
    api->cbid = cbid;
    api->start = work_start_ns > 1000 ? work_start_ns - 1000 : 0;
    api->end = api->start + 500;
    api->threadId = 4242;
    api->correlationId = correlation;
    buffer_used += sizeof *api;
    records_written++;
    return 0;
}

/* n kernels of step_ns each from start_ns (CUPTI clock), names cycling; graph_id 0 = launched eagerly (each with a
 * cuLaunchKernel record when that driver call is recorded), else inside that graph (one cuGraphLaunch record for all);
 * first a cuMemcpyHtoD_v2 call (a driver call that is not a launch), recorded when that call is on. As with CUPTI,
 * kernel records only while their kind is on, API records of the calls switched on whether or not it is. Returns the
 * kernel records written. */
int fake_emit(int n, uint64_t start_ns, uint64_t step_ns, uint32_t graph_id) {
    if (!requested_fn || (!kernels_on && !driver_on)) return 0;
    pthread_mutex_lock(&lock);
    int written = 0;
    write_launch(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, start_ns, next_correlation++);
    uint32_t graph_launch_correlation = 0;
    if (graph_id) {
        graph_launch_correlation = next_correlation++;
        if (repeat_graph_ids) {
            if (!repeated_graph_id) repeated_graph_id = graph_launch_correlation;
            graph_launch_correlation = repeated_graph_id;
        }
        write_launch(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, start_ns, graph_launch_correlation);
    }
    for (int i = 0; i < n; i++) {
        uint32_t correlation = graph_id ? graph_launch_correlation : next_correlation++;
        uint64_t t0 = start_ns + (uint64_t)i * step_ns;
        if (!graph_id && write_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, t0, correlation) != 0) break;
        if (!kernels_on) continue;
        if (ensure_space(sizeof(MP_KERNEL_RECORD)) != 0) break;
        MP_KERNEL_RECORD *k = (MP_KERNEL_RECORD *)(buffer + buffer_used);
        memset(k, 0, sizeof *k);
        k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k->start = t0;
        k->end = t0 + step_ns / 2;
        k->deviceId = 0;
        k->streamId = 7;
        k->correlationId = correlation;
        k->gridX = 132;
        k->blockX = 256;
        k->registersPerThread = 64;
        k->name = kernel_names[i % 3];
        k->graphId = graph_id;
        k->graphNodeId = graph_id ? (uint64_t)i + 1 : 0;
        buffer_used += sizeof *k;
        records_written++;
        written++;
    }
    pthread_mutex_unlock(&lock);
    return written;
}

/* one kernel record still running when the buffer was flushed: CUPTI leaves its end (or start) 0 */
int fake_emit_unfinished(uint64_t start_ns) {
    int n = fake_emit(1, start_ns, 1000, 0);
    if (n == 1) ((MP_KERNEL_RECORD *)(buffer + buffer_used - sizeof(MP_KERNEL_RECORD)))->end = 0;
    return n;
}

/* 1: every graph launch from now on (its cuGraphLaunch record and its kernels) carries the id of the first graph launch
 * made after this, as CUPTI 13.0 can give graph launches wrong correlation ids in sessions after the first (fixed in
 * CUDA 13.1 Update 1, CUPTI's release notes; what wrong ids it gives is not documented: repeated ones modelled here) */
void fake_set_repeated_graph_ids(int on) { repeat_graph_ids = on; repeated_graph_id = 0; }

/* 1: buffers are handed over without waiting for the client's callback (completions overlap later requests) */
void fake_set_async(int on) { async_mode = on; }

/* another CUPTI client holds the process (its name as cuptiSubscribe_v2 reports it); "" releases it */
void fake_set_holder(const char *name) { snprintf(holder, sizeof holder, "%s", name); }

/* buffers requested, buffers completed, distinct buffer addresses seen, buffers smaller than the size claimed for them,
 * buffers handed over with old records in them although the client said it zeroes them, API-call switches made, records written,
 * driver calls intercepted */
void fake_stats(uint64_t *out) {
    out[4] = dirty_buffers;
    out[0] = buffers_requested;
    out[1] = buffers_completed;
    out[2] = distinct_buffers;
    out[3] = undersized_buffers;
    out[5] = api_switches;
    out[6] = records_written;
    out[7] = calls_intercepted;
}
