/* max_profile NVTX injection library: logs NVTX ranges (default domain and named domains)
 * to the file named by MAX_PROFILE_NVTX_LOG, one line per event:
 *     <CLOCK_MONOTONIC ns> <tid> <KIND> <range id> <domain>\t<message>
 * KIND: PUSH POP START END MARK. Load it with NVTX_INJECTION64_PATH=<this .so>.
 * CLOCK_MONOTONIC is the clock of Python's time.perf_counter_ns() on Linux, so host step
 * records and these ranges share one time base. Only one NVTX injection library can be
 * active per process: not together with nsys, ncu or CUPTI's own injection.
 * Bounded for long-running apps: with MAX_PROFILE_NVTX_GATED=1 nothing is written until
 * max_profile_nvtx_record(1) (a profile() block), and max_profile_nvtx_truncate() empties the
 * file once a block has been read; MAX_PROFILE_NVTX_LOG_MAX_BYTES (default 1 GiB) caps the
 * file, events past the cap are counted (max_profile_nvtx_dropped), not written. */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_id = 1;
static volatile int recording = 1;
static unsigned long long written, cap = 1ull << 30, dropped;

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* Domains and registered strings are handed out as pointers to our own copies of the text. */
static const char *domain_name(nvtxDomainHandle_t d) { return d ? (const char *)d : "-"; }

static void clean(char *dst, const char *src, size_t cap) {
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) dst[i] = (src[i] == '\n' || src[i] == '\t') ? ' ' : src[i];
    dst[i] = 0;
}

static const char *msg(const nvtxEventAttributes_t *a, char *buf, size_t cap) {
    if (!a) return "";
    if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) { clean(buf, a->message.ascii, cap); return buf; }
    if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) {
        clean(buf, a->message.registered ? (const char *)a->message.registered : "", cap);
        return buf;
    }
    if (a->messageType == NVTX_MESSAGE_TYPE_UNICODE) return "<unicode>";
    return "";
}

static void emit(const char *kind, unsigned long long id, const char *domain, const char *m) {
    if (!out || !recording) return;
    unsigned long long t = now_ns();
    pthread_mutex_lock(&mu);
    if (cap && written >= cap) dropped++;
    else {
        int n = fprintf(out, "%llu %ld %s %llu %s\t%s\n", t, (long)syscall(SYS_gettid), kind, id, domain, m ? m : "");
        if (n > 0) written += (unsigned long long)n;
    }
    pthread_mutex_unlock(&mu);
}

static char *dup_text(const char *s) {
    char *c = strdup(s ? s : "");
    for (char *p = c; p && *p; p++) if (*p == ' ' || *p == '\t' || *p == '\n') *p = '_';
    return c;
}

/* core (default domain) */
static void mark_ex(const nvtxEventAttributes_t *a) { char b[512]; emit("MARK", 0, "-", msg(a, b, sizeof b)); }
static void mark_a(const char *m) { char b[512]; clean(b, m, sizeof b); emit("MARK", 0, "-", b); }
static nvtxRangeId_t start_ex(const nvtxEventAttributes_t *a) {
    char b[512]; unsigned long long id = __sync_fetch_and_add(&next_id, 1); emit("START", id, "-", msg(a, b, sizeof b)); return id; }
static nvtxRangeId_t start_a(const char *m) {
    char b[512]; unsigned long long id = __sync_fetch_and_add(&next_id, 1); clean(b, m, sizeof b); emit("START", id, "-", b); return id; }
static void end(nvtxRangeId_t id) { emit("END", id, "-", ""); }
static int push_ex(const nvtxEventAttributes_t *a) { char b[512]; emit("PUSH", 0, "-", msg(a, b, sizeof b)); return 0; }
static int push_a(const char *m) { char b[512]; clean(b, m, sizeof b); emit("PUSH", 0, "-", b); return 0; }
static int pop(void) { emit("POP", 0, "-", ""); return 0; }

/* core2 (named domains: what the nvtx Python package uses) */
static void d_mark_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { char b[512]; emit("MARK", 0, domain_name(d), msg(a, b, sizeof b)); }
static nvtxRangeId_t d_start_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    char b[512]; unsigned long long id = __sync_fetch_and_add(&next_id, 1); emit("START", id, domain_name(d), msg(a, b, sizeof b)); return id; }
static void d_end(nvtxDomainHandle_t d, nvtxRangeId_t id) { emit("END", id, domain_name(d), ""); }
static int d_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { char b[512]; emit("PUSH", 0, domain_name(d), msg(a, b, sizeof b)); return 0; }
static int d_pop(nvtxDomainHandle_t d) { emit("POP", 0, domain_name(d), ""); return 0; }
static nvtxDomainHandle_t d_create_a(const char *name) { return (nvtxDomainHandle_t)dup_text(name); }
static void d_destroy(nvtxDomainHandle_t d) { (void)d; }
static nvtxStringHandle_t d_register_a(nvtxDomainHandle_t d, const char *s) { (void)d; return (nvtxStringHandle_t)strdup(s ? s : ""); }

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    /* "%p" in the path becomes this process's pid: children that inherit the environment
     * (MAX's GPU recorder, serve workers) write their own files instead of interleaving. */
    const char *tmpl = getenv("MAX_PROFILE_NVTX_LOG");
    char path[4096];
    const char *src = tmpl ? tmpl : "max_profile_nvtx.%p.log";
    size_t o = 0;
    for (size_t i = 0; src[i] && o + 24 < sizeof path; i++) {
        if (src[i] == '%' && src[i + 1] == 'p') { o += (size_t)snprintf(path + o, sizeof path - o, "%ld", (long)getpid()); i++; }
        else path[o++] = src[i];
    }
    path[o] = 0;
    const char *gated = getenv("MAX_PROFILE_NVTX_GATED");
    if (gated && gated[0] == '1') recording = 0;
    const char *max_bytes = getenv("MAX_PROFILE_NVTX_LOG_MAX_BYTES");
    if (max_bytes && *max_bytes) cap = strtoull(max_bytes, NULL, 10);
    out = fopen(path, "a");
    if (out) setvbuf(out, NULL, _IOFBF, 1 << 20);
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    if (!cb) return 0;
    NvtxFunctionTable table = 0; unsigned int size = 0;
#define SET(id, fn) if ((unsigned)(id) < size && table[id]) *table[id] = (NvtxFunctionPointer)(fn)
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) && table) {
        SET(NVTX_CBID_CORE_MarkEx, mark_ex); SET(NVTX_CBID_CORE_MarkA, mark_a);
        SET(NVTX_CBID_CORE_RangeStartEx, start_ex); SET(NVTX_CBID_CORE_RangeStartA, start_a);
        SET(NVTX_CBID_CORE_RangeEnd, end);
        SET(NVTX_CBID_CORE_RangePushEx, push_ex); SET(NVTX_CBID_CORE_RangePushA, push_a);
        SET(NVTX_CBID_CORE_RangePop, pop);
    }
    table = 0; size = 0;
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) && table) {
        SET(NVTX_CBID_CORE2_DomainMarkEx, d_mark_ex);
        SET(NVTX_CBID_CORE2_DomainRangeStartEx, d_start_ex); SET(NVTX_CBID_CORE2_DomainRangeEnd, d_end);
        SET(NVTX_CBID_CORE2_DomainRangePushEx, d_push_ex); SET(NVTX_CBID_CORE2_DomainRangePop, d_pop);
        SET(NVTX_CBID_CORE2_DomainCreateA, d_create_a); SET(NVTX_CBID_CORE2_DomainDestroy, d_destroy);
        SET(NVTX_CBID_CORE2_DomainRegisterStringA, d_register_a);
    }
    return 1;
}

/* Called by max_profile (through ctypes) before it reads the log in the same process. */
void max_profile_nvtx_flush(void) {
    if (out) { pthread_mutex_lock(&mu); fflush(out); pthread_mutex_unlock(&mu); }
}

/* Gated mode: events are written only between max_profile_nvtx_record(1) and (0). */
void max_profile_nvtx_record(int on) { recording = on != 0; }

/* Empties the log (after max_profile has read a block) and resets the cap; the file is open
 * with O_APPEND, so the next event is written at the new end. */
void max_profile_nvtx_truncate(void) {
    if (!out) return;
    pthread_mutex_lock(&mu);
    fflush(out);
    if (ftruncate(fileno(out), 0) == 0) { written = 0; dropped = 0; }
    pthread_mutex_unlock(&mu);
}

/* Events not written because the log reached MAX_PROFILE_NVTX_LOG_MAX_BYTES. */
unsigned long long max_profile_nvtx_dropped(void) { return dropped; }

__attribute__((destructor)) static void flush_log(void) { max_profile_nvtx_flush(); }
