/*
 * max_profile's in-process kernel recorder: CUPTI activity buffers handled in C, no Python per record.
 *
 * CUPTI hands full activity buffers to buffer_completed() on its own thread. There each record is
 * copied, by kind, into one of two growing arrays (kernel records, launch-call records) with one
 * memcpy, and the buffer is returned to a free list: no GIL, no allocation per record. After
 * mp_stop() Python copies the two arrays out and decodes them with numpy (a structured dtype built
 * from mp_layout(): the offsets this file was compiled with, against the installed CUPTI headers).
 *
 * libcupti is opened with dlopen() from the path Python found, so the library can be built without
 * linking against a particular CUDA install. Build (max_profile does it on first use):
 *   gcc -shared -fPIC -O2 -I<cuda>/include -o libmax_profile_cupti.so cupti_ring.c -ldl -lpthread
 * Equivalent tool: nsys profile --trace=cuda (collection in C, decoding after the run).
 */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MP_KERNEL_RECORD
#define MP_KERNEL_RECORD CUpti_ActivityKernel10
#endif

typedef CUptiResult (*fn_register_t)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*fn_kind_t)(CUpti_ActivityKind);
typedef CUptiResult (*fn_flush_t)(uint32_t);
typedef CUptiResult (*fn_next_t)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*fn_dropped_t)(CUcontext, uint32_t, size_t *);
typedef CUptiResult (*fn_ts_t)(uint64_t *);
typedef CUptiResult (*fn_cbname_t)(CUpti_CallbackDomain, uint32_t, const char **);
typedef CUptiResult (*fn_api_enable_t)(CUpti_CallbackId, uint8_t);
typedef CUptiResult (*fn_result_t)(CUptiResult, const char **);
typedef CUptiResult (*fn_version_t)(uint32_t *);
typedef CUptiResult (*fn_subscribe_t)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult (*fn_subscribe2_t)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *, CUpti_SubscriberParams *);
typedef CUptiResult (*fn_unsubscribe_t)(CUpti_SubscriberHandle);
typedef CUptiResult (*fn_set_attribute_t)(CUpti_ActivityAttribute, size_t *, void *);

/* mp_set_options() flags */
#define MP_ZEROED_BUFFERS 1u /* hand CUPTI zeroed buffers (zeroed on CUPTI's thread, after their records are copied) */
#define MP_RELEASE_WHILE_PAUSED 2u /* unsubscribe at each pause, subscribe again at resume (no CUPTI subscriber between slices) */
#define MP_FLUSH_AT_PAUSE 4u /* a forced flush at each pause: no partly filled buffer carried from one slice into the next */

typedef struct {
    char *data;
    size_t len, cap;
} arena_t;

static struct {
    void *lib;
    fn_register_t reg;
    fn_kind_t enable, disable;
    fn_flush_t flush;
    fn_next_t next;
    fn_dropped_t dropped;
    fn_ts_t timestamp;
    fn_cbname_t cbname;
    fn_api_enable_t driver_api, runtime_api;
    fn_result_t result_string;
    fn_version_t version;
    fn_subscribe_t subscribe;
    fn_subscribe2_t subscribe2;
    fn_unsubscribe_t unsubscribe;
    fn_set_attribute_t set_attribute;
    CUpti_SubscriberHandle subscriber;
    int subscribed, recording, paused, launches, lost_at_resume;
    unsigned options, active_options;
    size_t buffer_bytes, max_bytes;
    pthread_mutex_t lock, free_lock; /* lock: the arrays and counters; free_lock: the free buffers only */
    arena_t kernels, apis;
    uint8_t *free_buffers[64];
    int n_free;
    uint64_t dropped_records, other_records, buffers_completed, callback_ns, graph_launches, launch_calls_kept;
    char error[512];
    char holder[128];
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .free_lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void set_error(const char *what, CUptiResult r) {
    const char *text = "?";
    if (S.result_string) S.result_string(r, &text);
    snprintf(S.error, sizeof S.error, "%s failed: CUPTI error %d (%s)", what, (int)r, text ? text : "?");
}

static int append(arena_t *a, const void *rec, size_t size) {
    if (S.kernels.len + S.apis.len + size > S.max_bytes) return -1;
    if (a->len + size > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : (size_t)4 << 20;
        while (cap < a->len + size) cap *= 2;
        char *grown = realloc(a->data, cap);
        if (!grown) return -1;
        a->data = grown;
        a->cap = cap;
    }
    memcpy(a->data + a->len, rec, size);
    a->len += size;
    return 0;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    uint8_t *b = NULL;
    int reused = 0;
    /* only the free list's lock: a thread asking for a buffer never waits while another buffer's records are copied */
    pthread_mutex_lock(&S.free_lock);
    if (S.n_free > 0) { b = S.free_buffers[--S.n_free]; reused = 1; }
    pthread_mutex_unlock(&S.free_lock);
    if (!b && posix_memalign((void **)&b, 8, S.buffer_bytes) != 0) b = NULL;
    else if (b && !reused && (S.active_options & MP_ZEROED_BUFFERS)) memset(b, 0, S.buffer_bytes); /* a fresh buffer: zeroed once */
    *buffer = b;
    *size = b ? S.buffer_bytes : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    uint64_t t0 = now_ns();
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&S.lock);
    while (valid > 0 && S.next(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL:
            if (append(&S.kernels, rec, sizeof(MP_KERNEL_RECORD)) != 0) S.dropped_records++;
            break;
        case CUPTI_ACTIVITY_KIND_DRIVER:
        case CUPTI_ACTIVITY_KIND_RUNTIME:
            if (append(&S.apis, rec, sizeof(CUpti_ActivityAPI)) != 0) S.dropped_records++;
            break;
        default:
            S.other_records++;
        }
    }
    size_t dropped = 0;
    if (S.dropped && S.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) S.dropped_records += dropped;
    S.buffers_completed++;
    /* zeroed here, on CUPTI's thread, so that CUPTI need not zero it on the launching thread when it is handed out again
     * (CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER); only the part CUPTI wrote: the rest is still zero */
    if (buffer && (S.active_options & MP_ZEROED_BUFFERS)) memset(buffer, 0, valid < size ? valid : size);
    S.callback_ns += now_ns() - t0;
    pthread_mutex_unlock(&S.lock);
    pthread_mutex_lock(&S.free_lock);
    if (buffer && S.n_free < 64) {
        S.free_buffers[S.n_free++] = buffer;
        buffer = NULL;
    }
    pthread_mutex_unlock(&S.free_lock);
    free(buffer);
}

static void CUPTIAPI no_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
    (void)userdata; (void)domain; (void)cbid; (void)data;
}

#define LOAD(field, name) S.field = (void *)dlsym(S.lib, name)

/* Open libcupti and resolve what is needed. 0 on success; else see mp_error(). */
int mp_open(const char *libcupti) {
    if (S.lib) return 0;
    S.lib = dlopen(libcupti, RTLD_NOW | RTLD_GLOBAL);
    if (!S.lib) {
        snprintf(S.error, sizeof S.error, "dlopen(%s) failed: %s", libcupti, dlerror());
        return -1;
    }
    LOAD(reg, "cuptiActivityRegisterCallbacks");
    LOAD(enable, "cuptiActivityEnable");
    LOAD(disable, "cuptiActivityDisable");
    LOAD(flush, "cuptiActivityFlushAll");
    LOAD(next, "cuptiActivityGetNextRecord");
    LOAD(dropped, "cuptiActivityGetNumDroppedRecords");
    LOAD(timestamp, "cuptiGetTimestamp");
    LOAD(cbname, "cuptiGetCallbackName");
    LOAD(driver_api, "cuptiActivityEnableDriverApi");
    LOAD(runtime_api, "cuptiActivityEnableRuntimeApi");
    LOAD(result_string, "cuptiGetResultString");
    LOAD(version, "cuptiGetVersion");
    LOAD(subscribe, "cuptiSubscribe");
    LOAD(subscribe2, "cuptiSubscribe_v2");
    LOAD(unsubscribe, "cuptiUnsubscribe");
    LOAD(set_attribute, "cuptiActivitySetAttribute");
    if (!S.reg || !S.enable || !S.disable || !S.flush || !S.next || !S.timestamp) {
        snprintf(S.error, sizeof S.error, "%s lacks the CUPTI activity API", libcupti);
        dlclose(S.lib);
        S.lib = NULL;
        return -1;
    }
    return 0;
}

/* The CUPTI API version of the opened library (cuptiGetVersion) and the one this file was compiled with. */
int mp_versions(uint32_t *runtime, uint32_t *compiled) {
    *compiled = CUPTI_API_VERSION;
    *runtime = 0;
    return S.version ? (int)S.version(runtime) : -1;
}

static int is_launch(const char *name) {
    return name && (!strncmp(name, "cuLaunch", 8) || !strncmp(name, "cudaLaunch", 10) || !strncmp(name, "cuGraphLaunch", 13) ||
                    !strncmp(name, "cudaGraphLaunch", 15));
}

/* Keep launch calls only among driver / runtime API records (CUDA 12.5+); returns the launch calls kept, -1 when this CUPTI cannot. */
/* The API callbacks a recording keeps (launch calls) and drops, found once by name: re-applied at every resume, since
 * switching the DRIVER / RUNTIME kinds back on records every call again (the H200: 7,027 API records in 33 resumed steps
 * against 1,670 in 128 steps never paused). Re-applying takes about 0.24 ms per resume on the H200. A pause that left
 * the DRIVER / RUNTIME kinds on and switched off only the launch calls (0.04 ms per pause or resume) made the steps
 * between slices slower: CUPTI still intercepts every driver call while the kinds are on. On the H200 (3B shape,
 * batch 1, 256 tokens, no device graphs), a sixteenth of the steps recorded cost as much as a quarter: 0.920
 * and 0.893 of untraced tok/s (paired medians). The kinds therefore go off at a pause. */
static int filter_n;
static struct { uint8_t runtime; uint8_t launch; uint16_t cbid; } filter_calls[4096];

static int keep_launch_calls_only(void) {
    if (!S.driver_api || !S.runtime_api || !S.cbname) return -1;
    fn_api_enable_t enable[2] = {S.driver_api, S.runtime_api};
    if (!filter_n) {
        struct { CUpti_CallbackDomain domain; int size; } domains[2] = {
            {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE}, {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE}};
        for (int d = 0; d < 2; d++) {
            for (int cbid = 1; cbid < domains[d].size && filter_n < 4096; cbid++) {
                const char *name = NULL;
                if (S.cbname(domains[d].domain, (uint32_t)cbid, &name) != CUPTI_SUCCESS) continue;
                filter_calls[filter_n].runtime = (uint8_t)d;
                filter_calls[filter_n].launch = (uint8_t)is_launch(name);
                filter_calls[filter_n].cbid = (uint16_t)cbid;
                filter_n++;
            }
        }
    }
    int kept = 0;
    for (int i = 0; i < filter_n; i++) {
        uint8_t launch = filter_calls[i].launch;
        if (enable[filter_calls[i].runtime]((CUpti_CallbackId)filter_calls[i].cbid, launch) == CUPTI_SUCCESS) kept += launch;
    }
    return kept;
}

static void set_buffer_bytes(size_t bytes) {
    if (bytes != S.buffer_bytes) { /* free buffers of another size must not be handed out as this size */
        pthread_mutex_lock(&S.free_lock);
        while (S.n_free > 0) free(S.free_buffers[--S.n_free]);
        pthread_mutex_unlock(&S.free_lock);
    }
    S.buffer_bytes = bytes;
}

/* Fault in memory before recording: the kernel array grown to arena_bytes (and the launch array to an eighth of it)
 * and `buffers` activity buffers of buffer_bytes on the free list, every page touched. A first recording then neither
 * grows its arrays nor faults in fresh pages inside CUPTI's callbacks. 0, or -1 when memory ran out. */
int mp_reserve(size_t arena_bytes, int buffers, size_t buffer_bytes) {
    int rc = 0;
    pthread_mutex_lock(&S.lock);
    arena_t *arenas[2] = {&S.kernels, &S.apis};
    size_t want[2] = {arena_bytes, arena_bytes / 8};
    for (int i = 0; i < 2; i++) {
        arena_t *a = arenas[i];
        if (a->cap < want[i]) {
            char *grown = realloc(a->data, want[i]);
            if (!grown) { rc = -1; continue; }
            a->data = grown;
            a->cap = want[i];
        }
        memset(a->data + a->len, 0, a->cap - a->len);
    }
    pthread_mutex_unlock(&S.lock);
    set_buffer_bytes(buffer_bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : buffer_bytes);
    pthread_mutex_lock(&S.free_lock);
    while (S.n_free < buffers && S.n_free < 64) {
        uint8_t *b = NULL;
        if (posix_memalign((void **)&b, 8, S.buffer_bytes) != 0) { rc = -1; break; }
        memset(b, 0, S.buffer_bytes);
        S.free_buffers[S.n_free++] = b;
    }
    pthread_mutex_unlock(&S.free_lock);
    return rc;
}

/* What is held between recordings: the kernel array's capacity in bytes and the buffers on the free list. */
void mp_held(size_t *kernel_cap, int *free_buffers) {
    *kernel_cap = S.kernels.cap;
    *free_buffers = S.n_free;
}

/* A start that failed after subscribing: the subscription dropped, so a later start (another window) can subscribe. */
static int give_up(void) {
    if (S.subscribed && S.unsubscribe) S.unsubscribe(S.subscriber);
    S.subscribed = 0;
    return -1;
}

/* Subscribe as "max_profile" (a client holding CUPTI already makes this fail: recording backs off rather than garble
 * both traces). 0, 1 when another client holds the process (S.holder names it), -1 on error (S.error). */
static int subscribe_self(void) {
    CUptiResult r;
    S.holder[0] = 0;
    if (S.subscribe2) {
        CUpti_SubscriberParams params;
        memset(&params, 0, sizeof params);
        params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
        params.subscriberName = "max_profile";
        params.oldSubscriberName = S.holder;
        params.oldSubscriberSize = sizeof S.holder;
        r = S.subscribe2(&S.subscriber, no_callback, NULL, &params);
    } else if (S.subscribe) {
        r = S.subscribe(&S.subscriber, no_callback, NULL);
    } else {
        r = CUPTI_SUCCESS;
    }
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        if (!S.holder[0]) snprintf(S.holder, sizeof S.holder, "another CUPTI client (Nsight Systems, Nsight Compute, kineto...)");
        return 1;
    }
    if (r != CUPTI_SUCCESS) {
        set_error("cuptiSubscribe", r);
        return -1;
    }
    S.subscribed = S.subscribe2 || S.subscribe;
    return 0;
}

/* Options for the next mp_start (MP_ZEROED_BUFFERS, MP_RELEASE_WHILE_PAUSED, MP_FLUSH_AT_PAUSE); 0 is the default
 * recording. */
void mp_set_options(unsigned options) { S.options = options; }

/* Start recording. launches: also record launch API calls (launch time and thread per kernel); max_bytes caps
 * the recorded arrays (records past it are counted as dropped).
 * Returns 0, or 1 when another CUPTI client holds the process (mp_holder() names it), or -1 on error. */
int mp_start(size_t buffer_bytes, int launches, size_t max_bytes) {
    if (!S.lib) {
        snprintf(S.error, sizeof S.error, "mp_open was not called");
        return -1;
    }
    if (S.recording) return 0;
    CUptiResult r;
    int busy = subscribe_self();
    if (busy) return busy;
    set_buffer_bytes(buffer_bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : buffer_bytes);
    S.max_bytes = max_bytes;
    S.launches = launches;
    /* registered at every start: another recorder of this process may have registered its own since */
    r = S.reg(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        set_error("cuptiActivityRegisterCallbacks", r);
        return give_up();
    }
    if ((S.options & MP_ZEROED_BUFFERS) && !(S.active_options & MP_ZEROED_BUFFERS)) { /* buffers kept from before hold old records */
        pthread_mutex_lock(&S.free_lock);
        for (int i = 0; i < S.n_free; i++) memset(S.free_buffers[i], 0, S.buffer_bytes);
        pthread_mutex_unlock(&S.free_lock);
    }
    S.active_options = S.options;
    if (S.set_attribute) {
        uint8_t zeroed = (S.options & MP_ZEROED_BUFFERS) ? 1 : 0;
        size_t size = sizeof zeroed;
        S.set_attribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, &size, &zeroed);
    }
    if ((r = S.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) != CUPTI_SUCCESS) {
        set_error("cuptiActivityEnable(CONCURRENT_KERNEL)", r);
        return give_up();
    }
    if (launches) {
        if ((r = S.enable(CUPTI_ACTIVITY_KIND_DRIVER)) != CUPTI_SUCCESS || (r = S.enable(CUPTI_ACTIVITY_KIND_RUNTIME)) != CUPTI_SUCCESS) {
            set_error("cuptiActivityEnable(DRIVER / RUNTIME)", r);
            S.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
            return give_up();
        }
        int kept = keep_launch_calls_only();
        S.launch_calls_kept = kept < 0 ? 0 : (uint64_t)kept;
    }
    S.recording = 1;
    S.paused = 0;
    S.lost_at_resume = 0;
    return 0;
}

/* Stop recording and flush every buffer (their records land in the arrays). */
static void switch_kinds(int on) {
    fn_kind_t f = on ? S.enable : S.disable;
    f(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (S.launches) {
        f(CUPTI_ACTIVITY_KIND_DRIVER);
        f(CUPTI_ACTIVITY_KIND_RUNTIME);
        if (on && S.launch_calls_kept) keep_launch_calls_only();
    }
}

/* Pause recording inside a recording (a slice of a sampled window ended): the activity kinds off, nothing flushed
 * (with MP_FLUSH_AT_PAUSE every buffer handed over, forced: a kernel still running then comes out without its end);
 * records of work launched before it still arrive. The subscription is kept, or with MP_RELEASE_WHILE_PAUSED given
 * up until mp_resume. 0, or -1 when not recording. */
int mp_pause(void) {
    if (!S.recording) return -1;
    if (!S.paused) {
        switch_kinds(0);
        if (S.active_options & MP_FLUSH_AT_PAUSE) S.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        if ((S.active_options & MP_RELEASE_WHILE_PAUSED) && S.subscribed && S.unsubscribe) {
            S.unsubscribe(S.subscriber);
            S.subscribed = 0;
        }
    }
    S.paused = 1;
    return 0;
}

/* Resume a paused recording (the next slice). 0; 1 when, released while paused, the subscription was taken by another
 * CUPTI client meanwhile (the recording stays paused to its end, S.holder names the client); -1 when not recording or
 * on error. */
int mp_resume(void) {
    if (!S.recording) return -1;
    if (S.lost_at_resume) return 1;
    if (S.paused) {
        if ((S.active_options & MP_RELEASE_WHILE_PAUSED) && !S.subscribed && (S.subscribe2 || S.subscribe)) {
            int busy = subscribe_self();
            if (busy) {
                S.lost_at_resume = busy > 0;
                return busy;
            }
        }
        switch_kinds(1);
    }
    S.paused = 0;
    return 0;
}

int mp_stop(void) {
    if (!S.recording) return 0;
    if (!S.paused) switch_kinds(0);
    S.paused = 0;
    CUptiResult r = S.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    S.recording = 0;
    if (S.subscribed && S.unsubscribe) S.unsubscribe(S.subscriber);
    S.subscribed = 0;
    if (r != CUPTI_SUCCESS) {
        set_error("cuptiActivityFlushAll", r);
        return -1;
    }
    return 0;
}

uint64_t mp_timestamp(void) {
    uint64_t t = 0;
    if (S.timestamp) S.timestamp(&t);
    return t;
}

/* The recorded arrays: pointer and byte length (valid until mp_clear). */
const char *mp_kernels(size_t *bytes) { *bytes = S.kernels.len; return S.kernels.data; }
const char *mp_apis(size_t *bytes) { *bytes = S.apis.len; return S.apis.data; }

void mp_clear(void) {
    pthread_mutex_lock(&S.lock);
    S.kernels.len = S.apis.len = 0;
    S.dropped_records = S.other_records = S.buffers_completed = S.callback_ns = 0;
    pthread_mutex_unlock(&S.lock);
}

/* Counters: dropped records, records of other kinds, buffers completed, ns spent in buffer_completed, launch calls kept. */
void mp_stats(uint64_t *out) {
    out[0] = S.dropped_records;
    out[1] = S.other_records;
    out[2] = S.buffers_completed;
    out[3] = S.callback_ns;
    out[4] = S.launch_calls_kept;
}

const char *mp_error(void) { return S.error; }
const char *mp_holder(void) { return S.holder; }

/* Record layouts this file was compiled with: sizes, then field offsets (see max_profile/collect/live/cupti_decode.py). */
#define OFF(T, f) (int32_t) offsetof(T, f)
int mp_layout(int32_t *out, int n) {
    int32_t v[] = {
        (int32_t)sizeof(MP_KERNEL_RECORD), OFF(MP_KERNEL_RECORD, kind), OFF(MP_KERNEL_RECORD, start), OFF(MP_KERNEL_RECORD, end),
        OFF(MP_KERNEL_RECORD, deviceId), OFF(MP_KERNEL_RECORD, streamId), OFF(MP_KERNEL_RECORD, correlationId), OFF(MP_KERNEL_RECORD, gridX),
        OFF(MP_KERNEL_RECORD, blockX), OFF(MP_KERNEL_RECORD, registersPerThread), OFF(MP_KERNEL_RECORD, name), OFF(MP_KERNEL_RECORD, graphNodeId),
        OFF(MP_KERNEL_RECORD, graphId),
        (int32_t)sizeof(CUpti_ActivityAPI), OFF(CUpti_ActivityAPI, kind), OFF(CUpti_ActivityAPI, cbid), OFF(CUpti_ActivityAPI, start),
        OFF(CUpti_ActivityAPI, end), OFF(CUpti_ActivityAPI, threadId), OFF(CUpti_ActivityAPI, correlationId),
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_RUNTIME,
        (int32_t)CUPTI_API_VERSION,
    };
    int count = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < n && i < count; i++) out[i] = v[i];
    return count;
}

/* A C string at an address CUPTI handed out (kernel names live in CUPTI's memory for the process's life). */
const char *mp_string(uintptr_t address) { return (const char *)address; }

/* The name of a driver (kind DRIVER) or runtime (kind RUNTIME) API call id, or "" when unknown. */
const char *mp_callback_name(int kind, uint32_t cbid) {
    const char *name = NULL;
    if (!S.cbname) return "";
    CUpti_CallbackDomain domain = kind == CUPTI_ACTIVITY_KIND_DRIVER ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    if (S.cbname(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "";
    return name;
}
