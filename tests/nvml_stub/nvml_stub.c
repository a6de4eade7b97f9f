/*
 * kvpin.fleet: a stub libnvidia-ml.so.1 for machines without NVIDIA GPUs.
 * Copyright: kvpin.fleet contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * It answers the NVML calls that kvpin.fleet's gpu_facts makes (and, with
 * NVML_ERROR_NOT_SUPPORTED, the optional ones GPUStack 2.3's NVIDIA detector makes)
 * from a JSON fixture, so the real pynvml binding code runs against it.
 *
 * Fixture path: $KVPIN_NVML_STUB_CONFIG, else /etc/kvpin/nvml-stub.json (the lab nodes).
 * The fixture is read again on every nvmlInit*, so one process can switch fixtures
 * between init/shutdown pairs. Fixture format: tests/nvml_stub/README.md.
 *
 * Struct layouts and signatures follow nvml.h as nvidia-ml-py 13.615.71 (pynvml.py)
 * declares them: nvmlMemory_t / nvmlMemory_v2_t, nvmlPciInfo_t (v3), nvmlProcessInfo_t
 * (v2 == v3 layout).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVML types and constants (values from nvml.h / pynvml.py) ---- */
typedef int nvmlReturn_t;
typedef struct stub_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_MEMORY_V2_VERSION 0x02000028u /* pynvml: nvmlMemory_v2 */
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* v1: reserved + allocated */
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used; /* v2: allocated by contexts, reserved excluded */
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

struct named_value {
    const char *name;
    int value;
};

/* nvmlGpuTopologyLevel_t */
static const struct named_value TOPOLOGY_LEVELS[] = {
    {"INTERNAL", 0}, {"SINGLE", 10}, {"MULTIPLE", 20},
    {"HOSTBRIDGE", 30}, {"NODE", 40}, {"SYSTEM", 50},
};
/* nvmlGpuP2PStatus_t */
static const struct named_value P2P_STATUSES[] = {
    {"OK", 0}, {"CHIPSET_NOT_SUPPORTED", 1}, {"GPU_NOT_SUPPORTED", 2},
    {"IOH_TOPOLOGY_NOT_SUPPORTED", 3}, {"DISABLED_BY_REGKEY", 4},
    {"NOT_SUPPORTED", 5}, {"UNKNOWN", 6},
};
/* nvmlGpuP2PCapsIndex_t: READ, WRITE, NVLINK, ATOMICS, PCI (fixture key per index) */
static const char *P2P_CAP_KEYS[] = {"read", "write", "nvlink", "atomics", "pci"};
#define P2P_CAPS 5

/* ---- fixture model ---- */
#define MAX_DEVICES 32
#define MAX_PROCESSES 64
#define MAX_NVLINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define MAX_FAILS 16
#define UNSET (-1LL)

struct stub_device {
    int index;
    char name[96];
    char uuid[96];
    char bus_id[32];
    unsigned int domain, bus, dev;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_total, memory_reserved, memory_used;
    int cc_major, cc_minor;
    long long power_limit_mw, enforced_power_limit_mw, default_power_limit_mw; /* UNSET: not supported */
    long long minor_number;
    int mig_supported;
    unsigned int mig_current, mig_pending;
    int nvlink_count; /* -1: no NVLink on this GPU */
    int nvlink_active[MAX_NVLINKS];
    int process_count;
    unsigned int process_pid[MAX_PROCESSES];
    unsigned long long process_used[MAX_PROCESSES];
};

struct stub_fail {
    char call[96];
    int device; /* -1: any device (and device-less calls) */
    int error;
};

static struct {
    char driver_version[80];
    char nvml_version[80];
    int cuda_driver_version;
    int init_error;
    int device_count;
    struct stub_device devices[MAX_DEVICES];
    int has_pair[MAX_DEVICES][MAX_DEVICES];
    int topology[MAX_DEVICES][MAX_DEVICES];
    int p2p[MAX_DEVICES][MAX_DEVICES][P2P_CAPS];
    int fail_count;
    struct stub_fail fails[MAX_FAILS];
} cfg;

static int init_refcount;

/* ---- a small JSON reader (RFC 8259 subset: no duplicate-key checks) ---- */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jval {
    enum jtype t;
    int boolean;
    int is_int;
    long long integer;
    double number;
    char *str;
    size_t n;
    struct jval **items;
    char **keys;
};

struct jparser {
    const char *p, *end;
    char err[160];
};

static void jfree(struct jval *v)
{
    size_t i;
    if (!v)
        return;
    for (i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static void jskip_ws(struct jparser *jp)
{
    while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
        jp->p++;
}

static struct jval *jnew(enum jtype t)
{
    struct jval *v = calloc(1, sizeof(*v));
    if (v)
        v->t = t;
    return v;
}

static int jappend(struct jval *v, char *key, struct jval *item)
{
    struct jval **items = realloc(v->items, (v->n + 1) * sizeof(*items));
    if (!items)
        return -1;
    v->items = items;
    if (v->t == J_OBJ) {
        char **keys = realloc(v->keys, (v->n + 1) * sizeof(*keys));
        if (!keys)
            return -1;
        v->keys = keys;
        v->keys[v->n] = key;
    }
    v->items[v->n++] = item;
    return 0;
}

static void jerror(struct jparser *jp, const char *msg)
{
    if (!jp->err[0])
        snprintf(jp->err, sizeof(jp->err), "%s", msg);
}

static void put_utf8(char *out, size_t *len, unsigned long cp)
{
    if (cp < 0x80) {
        out[(*len)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*len)++] = (char)(0xC0 | (cp >> 6));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*len)++] = (char)(0xE0 | (cp >> 12));
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*len)++] = (char)(0xF0 | (cp >> 18));
        out[(*len)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int jhex4(struct jparser *jp, unsigned long *cp)
{
    int i;
    *cp = 0;
    if (jp->end - jp->p < 4)
        return -1;
    for (i = 0; i < 4; i++) {
        char c = *jp->p++;
        *cp <<= 4;
        if (c >= '0' && c <= '9')
            *cp |= (unsigned long)(c - '0');
        else if (c >= 'a' && c <= 'f')
            *cp |= (unsigned long)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            *cp |= (unsigned long)(c - 'A' + 10);
        else
            return -1;
    }
    return 0;
}

/* Parses a string starting at the opening quote; returns a malloc'd UTF-8 string. */
static char *jstring(struct jparser *jp)
{
    /* every escape yields at most as many bytes as it takes in the input */
    char *out = malloc((size_t)(jp->end - jp->p) + 1);
    size_t len = 0;
    if (!out) {
        jerror(jp, "out of memory");
        return NULL;
    }
    jp->p++; /* opening quote */
    while (jp->p < jp->end) {
        char c = *jp->p++;
        if (c == '"') {
            out[len] = '\0';
            return out;
        }
        if ((unsigned char)c < 0x20) {
            jerror(jp, "control character in string");
            break;
        }
        if (c != '\\') {
            out[len++] = c;
            continue;
        }
        if (jp->p >= jp->end)
            break;
        c = *jp->p++;
        switch (c) {
        case '"': out[len++] = '"'; break;
        case '\\': out[len++] = '\\'; break;
        case '/': out[len++] = '/'; break;
        case 'b': out[len++] = '\b'; break;
        case 'f': out[len++] = '\f'; break;
        case 'n': out[len++] = '\n'; break;
        case 'r': out[len++] = '\r'; break;
        case 't': out[len++] = '\t'; break;
        case 'u': {
            unsigned long cp, lo;
            if (jhex4(jp, &cp) != 0) {
                jerror(jp, "bad \\u escape");
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF && jp->end - jp->p >= 6 && jp->p[0] == '\\' && jp->p[1] == 'u') {
                jp->p += 2;
                if (jhex4(jp, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
                    jerror(jp, "bad surrogate pair");
                    free(out);
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                jerror(jp, "lone surrogate in \\u escape");
                free(out);
                return NULL;
            }
            put_utf8(out, &len, cp);
            break;
        }
        default:
            jerror(jp, "bad escape in string");
            free(out);
            return NULL;
        }
    }
    jerror(jp, "unterminated string");
    free(out);
    return NULL;
}

static struct jval *jvalue(struct jparser *jp, int depth);

static struct jval *jcontainer(struct jparser *jp, int depth, int is_obj)
{
    struct jval *v = jnew(is_obj ? J_OBJ : J_ARR);
    char close = is_obj ? '}' : ']';
    if (!v) {
        jerror(jp, "out of memory");
        return NULL;
    }
    jp->p++;
    jskip_ws(jp);
    if (jp->p < jp->end && *jp->p == close) {
        jp->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        struct jval *item;
        jskip_ws(jp);
        if (is_obj) {
            if (jp->p >= jp->end || *jp->p != '"') {
                jerror(jp, "expected a string key");
                break;
            }
            key = jstring(jp);
            if (!key)
                break;
            jskip_ws(jp);
            if (jp->p >= jp->end || *jp->p != ':') {
                jerror(jp, "expected ':'");
                free(key);
                break;
            }
            jp->p++;
        }
        item = jvalue(jp, depth + 1);
        if (!item || jappend(v, key, item) != 0) {
            jfree(item);
            free(key);
            jerror(jp, "out of memory");
            break;
        }
        jskip_ws(jp);
        if (jp->p < jp->end && *jp->p == ',') {
            jp->p++;
            continue;
        }
        if (jp->p < jp->end && *jp->p == close) {
            jp->p++;
            return v;
        }
        jerror(jp, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
    }
    jfree(v);
    return NULL;
}

static struct jval *jvalue(struct jparser *jp, int depth)
{
    struct jval *v;
    if (depth > 64) {
        jerror(jp, "nested too deeply");
        return NULL;
    }
    jskip_ws(jp);
    if (jp->p >= jp->end) {
        jerror(jp, "unexpected end of input");
        return NULL;
    }
    switch (*jp->p) {
    case '{':
        return jcontainer(jp, depth, 1);
    case '[':
        return jcontainer(jp, depth, 0);
    case '"':
        v = jnew(J_STR);
        if (!v || !(v->str = jstring(jp))) {
            free(v);
            return NULL;
        }
        return v;
    default:
        break;
    }
    if (jp->end - jp->p >= 4 && strncmp(jp->p, "null", 4) == 0) {
        jp->p += 4;
        return jnew(J_NULL);
    }
    if (jp->end - jp->p >= 4 && strncmp(jp->p, "true", 4) == 0) {
        jp->p += 4;
        v = jnew(J_BOOL);
        if (v)
            v->boolean = 1;
        return v;
    }
    if (jp->end - jp->p >= 5 && strncmp(jp->p, "false", 5) == 0) {
        jp->p += 5;
        return jnew(J_BOOL);
    }
    if (*jp->p == '-' || (*jp->p >= '0' && *jp->p <= '9')) {
        const char *start = jp->p;
        char buf[64];
        size_t len;
        int is_int = 1;
        if (*jp->p == '-')
            jp->p++;
        while (jp->p < jp->end && ((*jp->p >= '0' && *jp->p <= '9') || *jp->p == '.' || *jp->p == 'e' ||
                                   *jp->p == 'E' || *jp->p == '+' || *jp->p == '-')) {
            if (*jp->p == '.' || *jp->p == 'e' || *jp->p == 'E')
                is_int = 0;
            jp->p++;
        }
        len = (size_t)(jp->p - start);
        if (len >= sizeof(buf)) {
            jerror(jp, "number too long");
            return NULL;
        }
        memcpy(buf, start, len);
        buf[len] = '\0';
        v = jnew(J_NUM);
        if (!v)
            return NULL;
        errno = 0;
        v->number = strtod(buf, NULL);
        if (is_int) {
            v->integer = strtoll(buf, NULL, 10);
            v->is_int = errno == 0;
        }
        return v;
    }
    jerror(jp, "unexpected character");
    return NULL;
}

static struct jval *jget(const struct jval *obj, const char *key)
{
    size_t i;
    if (!obj || obj->t != J_OBJ)
        return NULL;
    for (i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

/* ---- fixture loading ---- */
static char load_error[512];

static int fixture_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_error, sizeof(load_error), fmt, ap);
    va_end(ap);
    return -1;
}

static const char *fixture_path(void)
{
    const char *path = getenv("KVPIN_NVML_STUB_CONFIG");
    return (path && *path) ? path : "/etc/kvpin/nvml-stub.json";
}

/* Integer field: absent -> dflt; null -> UNSET; else must be an integer (or a "0x.." string). */
static int get_int(const struct jval *obj, const char *key, long long dflt, long long *out, const char *where)
{
    const struct jval *v = jget(obj, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->t == J_NULL) {
        *out = UNSET;
        return 0;
    }
    if (v->t == J_NUM && v->is_int) {
        *out = v->integer;
        return 0;
    }
    if (v->t == J_STR && v->str[0]) {
        char *end;
        errno = 0;
        *out = strtoll(v->str, &end, 0);
        if (errno == 0 && *end == '\0')
            return 0;
    }
    return fixture_error("%s.%s: expected an integer", where, key);
}

static int get_str(const struct jval *obj, const char *key, char *out, size_t size, int required, const char *where)
{
    const struct jval *v = jget(obj, key);
    if (!v) {
        if (required)
            return fixture_error("%s.%s: missing", where, key);
        out[0] = '\0';
        return 0;
    }
    if (v->t != J_STR)
        return fixture_error("%s.%s: expected a string", where, key);
    if (strlen(v->str) >= size)
        return fixture_error("%s.%s: longer than %zu bytes", where, key, size - 1);
    snprintf(out, size, "%s", v->str);
    return 0;
}

static int lookup_name(const char *name, const struct named_value *t, size_t count, int *out)
{
    size_t i;
    for (i = 0; i < count; i++)
        if (strcmp(t[i].name, name) == 0) {
            *out = t[i].value;
            return 0;
        }
    return -1;
}

static int load_device(const struct jval *d, int index)
{
    struct stub_device *dev = &cfg.devices[index];
    char where[48];
    long long v;
    const struct jval *mig, *links, *procs;
    size_t i;

    snprintf(where, sizeof(where), "devices[%d]", index);
    if (!d || d->t != J_OBJ)
        return fixture_error("%s: expected an object", where);
    memset(dev, 0, sizeof(*dev));
    dev->index = index;
    if (get_str(d, "name", dev->name, sizeof(dev->name), 1, where) || get_str(d, "uuid", dev->uuid, sizeof(dev->uuid), 1, where) ||
        get_str(d, "pci_bus_id", dev->bus_id, sizeof(dev->bus_id), 1, where))
        return -1;
    if (sscanf(dev->bus_id, "%x:%x:%x.", &dev->domain, &dev->bus, &dev->dev) != 3)
        return fixture_error("%s.pci_bus_id: expected DDDDDDDD:BB:DD.F, got %s", where, dev->bus_id);
    if (get_int(d, "pci_device_id", 0, &v, where))
        return -1;
    dev->pci_device_id = (unsigned int)v;
    if (get_int(d, "pci_subsystem_id", 0, &v, where))
        return -1;
    dev->pci_subsystem_id = (unsigned int)v;

    if (get_int(d, "memory_total", UNSET, &v, where))
        return -1;
    if (v <= 0)
        return fixture_error("%s.memory_total: required, a positive number of bytes", where);
    dev->memory_total = (unsigned long long)v;
    if (get_int(d, "memory_reserved", 0, &v, where))
        return -1;
    dev->memory_reserved = v < 0 ? 0 : (unsigned long long)v;
    if (get_int(d, "memory_used", 0, &v, where))
        return -1;
    dev->memory_used = v < 0 ? 0 : (unsigned long long)v;
    if (dev->memory_reserved + dev->memory_used > dev->memory_total)
        return fixture_error("%s: memory_reserved + memory_used exceed memory_total", where);

    if (get_int(d, "cuda_cc_major", UNSET, &v, where))
        return -1;
    dev->cc_major = (int)v;
    if (get_int(d, "cuda_cc_minor", UNSET, &v, where))
        return -1;
    dev->cc_minor = (int)v;
    if (dev->cc_major < 0 || dev->cc_minor < 0)
        return fixture_error("%s: cuda_cc_major and cuda_cc_minor are required", where);

    if (get_int(d, "power_limit_mw", UNSET, &dev->power_limit_mw, where) ||
        get_int(d, "enforced_power_limit_mw", dev->power_limit_mw, &dev->enforced_power_limit_mw, where) ||
        get_int(d, "default_power_limit_mw", dev->power_limit_mw, &dev->default_power_limit_mw, where) ||
        get_int(d, "minor_number", index, &dev->minor_number, where))
        return -1;

    mig = jget(d, "mig_mode");
    if (mig && mig->t == J_OBJ) {
        dev->mig_supported = 1;
        if (get_int(mig, "current", 0, &v, where))
            return -1;
        dev->mig_current = (unsigned int)v;
        if (get_int(mig, "pending", 0, &v, where))
            return -1;
        dev->mig_pending = (unsigned int)v;
    } else if (mig && mig->t != J_NULL) {
        return fixture_error("%s.mig_mode: expected an object or null", where);
    }

    links = jget(d, "nvlink_active");
    dev->nvlink_count = -1;
    if (links && links->t == J_ARR) {
        if (links->n > MAX_NVLINKS)
            return fixture_error("%s.nvlink_active: at most %d links", where, MAX_NVLINKS);
        dev->nvlink_count = (int)links->n;
        for (i = 0; i < links->n; i++) {
            if (links->items[i]->t != J_BOOL)
                return fixture_error("%s.nvlink_active[%zu]: expected true/false", where, i);
            dev->nvlink_active[i] = links->items[i]->boolean;
        }
    } else if (links && links->t != J_NULL) {
        return fixture_error("%s.nvlink_active: expected a list of booleans or null", where);
    }

    procs = jget(d, "processes");
    if (procs && procs->t == J_ARR) {
        if (procs->n > MAX_PROCESSES)
            return fixture_error("%s.processes: at most %d", where, MAX_PROCESSES);
        for (i = 0; i < procs->n; i++) {
            long long pid, used;
            if (get_int(procs->items[i], "pid", UNSET, &pid, where) || get_int(procs->items[i], "used_memory", UNSET, &used, where))
                return -1;
            if (pid <= 0 || used < 0)
                return fixture_error("%s.processes[%zu]: needs pid and used_memory", where, i);
            dev->process_pid[i] = (unsigned int)pid;
            dev->process_used[i] = (unsigned long long)used;
        }
        dev->process_count = (int)procs->n;
    } else if (procs && procs->t != J_NULL) {
        return fixture_error("%s.processes: expected a list", where);
    }
    return 0;
}

static int load_pair(const struct jval *pair, size_t n)
{
    char where[48];
    const struct jval *gpus, *anc, *p2p;
    long long a, b;
    int k;

    snprintf(where, sizeof(where), "topology[%zu]", n);
    gpus = jget(pair, "gpus");
    if (!gpus || gpus->t != J_ARR || gpus->n != 2 || gpus->items[0]->t != J_NUM || gpus->items[1]->t != J_NUM)
        return fixture_error("%s.gpus: expected [a, b]", where);
    a = gpus->items[0]->integer;
    b = gpus->items[1]->integer;
    if (a < 0 || b < 0 || a >= cfg.device_count || b >= cfg.device_count || a == b)
        return fixture_error("%s.gpus: indexes must be two different devices", where);
    cfg.has_pair[a][b] = cfg.has_pair[b][a] = 1;

    anc = jget(pair, "common_ancestor");
    if (!anc || anc->t != J_STR || lookup_name(anc->str, TOPOLOGY_LEVELS, sizeof(TOPOLOGY_LEVELS) / sizeof(TOPOLOGY_LEVELS[0]), &cfg.topology[a][b]) != 0)
        return fixture_error("%s.common_ancestor: one of INTERNAL SINGLE MULTIPLE HOSTBRIDGE NODE SYSTEM", where);
    cfg.topology[b][a] = cfg.topology[a][b];

    p2p = jget(pair, "p2p");
    for (k = 0; k < P2P_CAPS; k++) {
        const struct jval *s = jget(p2p, P2P_CAP_KEYS[k]);
        int status = 5; /* NVML_P2P_STATUS_NOT_SUPPORTED when the fixture says nothing */
        if (s && (s->t != J_STR || lookup_name(s->str, P2P_STATUSES, sizeof(P2P_STATUSES) / sizeof(P2P_STATUSES[0]), &status) != 0))
            return fixture_error("%s.p2p.%s: one of OK CHIPSET_NOT_SUPPORTED GPU_NOT_SUPPORTED IOH_TOPOLOGY_NOT_SUPPORTED DISABLED_BY_REGKEY NOT_SUPPORTED UNKNOWN", where, P2P_CAP_KEYS[k]);
        cfg.p2p[a][b][k] = cfg.p2p[b][a][k] = status;
    }
    return 0;
}

static int load_fail(const struct jval *f)
{
    struct stub_fail *out;
    long long v;
    if (cfg.fail_count >= MAX_FAILS)
        return fixture_error("fail: at most %d entries", MAX_FAILS);
    out = &cfg.fails[cfg.fail_count];
    if (!f || f->t != J_OBJ)
        return fixture_error("fail: expected an object or a list of objects");
    if (get_str(f, "call", out->call, sizeof(out->call), 1, "fail"))
        return -1;
    if (get_int(f, "device", -1, &v, "fail"))
        return -1;
    out->device = (int)v;
    if (get_int(f, "error", UNSET, &v, "fail"))
        return -1;
    if (v <= 0)
        return fixture_error("fail.error: required, a non-zero nvmlReturn_t");
    out->error = (int)v;
    cfg.fail_count++;
    return 0;
}

static int load_tree(const struct jval *root)
{
    const struct jval *devices, *topology, *fail;
    long long v;
    size_t i;

    memset(&cfg, 0, sizeof(cfg));
    if (!root || root->t != J_OBJ)
        return fixture_error("top level: expected an object");
    if (get_int(root, "init_error", 0, &v, "top"))
        return -1;
    cfg.init_error = (int)v;
    if (get_str(root, "driver_version", cfg.driver_version, sizeof(cfg.driver_version), 0, "top") ||
        get_str(root, "nvml_version", cfg.nvml_version, sizeof(cfg.nvml_version), 0, "top"))
        return -1;
    if (get_int(root, "cuda_driver_version", 0, &v, "top"))
        return -1;
    cfg.cuda_driver_version = (int)v;

    fail = jget(root, "fail");
    if (fail && fail->t == J_ARR) {
        for (i = 0; i < fail->n; i++)
            if (load_fail(fail->items[i]))
                return -1;
    } else if (fail && fail->t != J_NULL) {
        if (load_fail(fail))
            return -1;
    }

    devices = jget(root, "devices");
    if (devices && devices->t != J_ARR)
        return fixture_error("devices: expected a list");
    if (devices) {
        if (devices->n > MAX_DEVICES)
            return fixture_error("devices: at most %d", MAX_DEVICES);
        cfg.device_count = (int)devices->n;
        for (i = 0; i < devices->n; i++)
            if (load_device(devices->items[i], (int)i))
                return -1;
    }
    if (cfg.device_count > 0 && !cfg.driver_version[0])
        return fixture_error("driver_version: required when there are devices");

    topology = jget(root, "topology");
    if (topology && topology->t != J_ARR)
        return fixture_error("topology: expected a list");
    for (i = 0; topology && i < topology->n; i++)
        if (load_pair(topology->items[i], i))
            return -1;
    return 0;
}

static int read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    size_t cap = 4096, n = 0;
    char *buf;
    if (!f)
        return fixture_error("cannot open: %s", strerror(errno));
    buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        cap *= 2;
        {
            char *bigger = realloc(buf, cap);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    if (!buf || ferror(f)) {
        fclose(f);
        free(buf);
        return fixture_error("cannot read: %s", strerror(errno));
    }
    fclose(f);
    *data = buf;
    *len = n;
    return 0;
}

/* Reads the fixture into cfg. On failure cfg is emptied and the reason goes to stderr
 * (nvmlInit then answers NVML_ERROR_UNKNOWN, so a broken fixture is loud). */
static int load_fixture(void)
{
    const char *path = fixture_path();
    struct jparser jp;
    struct jval *root;
    char *data = NULL;
    size_t len = 0;
    int rc;

    load_error[0] = '\0';
    if (read_file(path, &data, &len) != 0) {
        memset(&cfg, 0, sizeof(cfg));
        fprintf(stderr, "kvpin nvml stub: %s: %s\n", path, load_error);
        return -1;
    }
    memset(&jp, 0, sizeof(jp));
    jp.p = data;
    jp.end = data + len;
    root = jvalue(&jp, 0);
    jskip_ws(&jp);
    if (root && jp.p != jp.end)
        jerror(&jp, "trailing data after the top-level value");
    if (!root || jp.err[0]) {
        fixture_error("JSON error at byte %ld: %s", (long)(jp.p - data), jp.err[0] ? jp.err : "invalid");
        rc = -1;
    } else {
        rc = load_tree(root);
    }
    jfree(root);
    free(data);
    if (rc != 0) {
        char reason[512];
        snprintf(reason, sizeof(reason), "%s", load_error);
        memset(&cfg, 0, sizeof(cfg));
        fprintf(stderr, "kvpin nvml stub: %s: %s\n", path, reason);
    }
    return rc;
}

/* ---- call plumbing ---- */
static int injected_error(const char *call, const struct stub_device *a, const struct stub_device *b)
{
    int i;
    for (i = 0; i < cfg.fail_count; i++) {
        const struct stub_fail *f = &cfg.fails[i];
        if (strcmp(f->call, call) != 0)
            continue;
        if (f->device < 0 || (a && a->index == f->device) || (b && b->index == f->device))
            return f->error;
    }
    return 0;
}

static int valid_handle(nvmlDevice_t d)
{
    return d >= cfg.devices && d < cfg.devices + cfg.device_count;
}

/* Common prologue of every answering call: initialised? the device handles it names
 * valid? a failure injected for this call (and device)? */
static nvmlReturn_t enter(const char *call, int handles, nvmlDevice_t a, nvmlDevice_t b)
{
    if (init_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if ((handles >= 1 && !valid_handle(a)) || (handles >= 2 && !valid_handle(b)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return injected_error(call, handles >= 1 ? a : NULL, handles >= 2 ? b : NULL);
}

#define ENTER(call, handles, a, b)                       \
    do {                                                 \
        nvmlReturn_t entered_ = enter((call), (handles), (a), (b)); \
        if (entered_ != NVML_SUCCESS)                    \
            return entered_;                             \
    } while (0)
#define ENTER0(call) ENTER(call, 0, NULL, NULL)
#define ENTER1(call, a) ENTER(call, 1, a, NULL)
#define ENTER2(call, a, b) ENTER(call, 2, a, b)

static nvmlReturn_t copy_string(char *out, unsigned int size, const char *value)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > size)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / errors ---- */
static nvmlReturn_t do_init(const char *call)
{
    int injected;
    if (load_fixture() != 0)
        return NVML_ERROR_UNKNOWN;
    if (cfg.init_error)
        return cfg.init_error;
    injected = injected_error(call, NULL, NULL);
    if (injected)
        return injected;
    init_refcount++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return do_init("nvmlInit_v2");
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return do_init("nvmlInit");
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (init_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    init_refcount--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request";
    case 18: return "RM has detected an NVML/RM version mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system queries ---- */
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER0("nvmlSystemGetDriverVersion");
    return copy_string(version, length, cfg.driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    ENTER0("nvmlSystemGetNVMLVersion");
    if (!cfg.nvml_version[0])
        return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(version, length, cfg.nvml_version);
}

static nvmlReturn_t cuda_driver_version(const char *call, int *version)
{
    ENTER0(call);
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!cfg.cuda_driver_version)
        return NVML_ERROR_NOT_SUPPORTED;
    *version = cfg.cuda_driver_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    return cuda_driver_version("nvmlSystemGetCudaDriverVersion", version);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return cuda_driver_version("nvmlSystemGetCudaDriverVersion_v2", version);
}

/* ---- device enumeration ---- */
static nvmlReturn_t device_count(const char *call, unsigned int *count)
{
    ENTER0(call);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)cfg.device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    return device_count("nvmlDeviceGetCount_v2", count);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return device_count("nvmlDeviceGetCount", count);
}

static nvmlReturn_t handle_by_index(const char *call, unsigned int index, nvmlDevice_t *device)
{
    int injected;
    if (init_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)cfg.device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    injected = injected_error(call, &cfg.devices[index], NULL);
    if (injected)
        return injected;
    *device = &cfg.devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index("nvmlDeviceGetHandleByIndex", index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    int i;
    ENTER0("nvmlDeviceGetHandleByUUID");
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < cfg.device_count; i++)
        if (strcmp(cfg.devices[i].uuid, uuid) == 0) {
            *device = &cfg.devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    unsigned int domain, bus, dev;
    int i;
    ENTER0("nvmlDeviceGetHandleByPciBusId_v2");
    if (!bus_id || !device || sscanf(bus_id, "%x:%x:%x.", &domain, &bus, &dev) != 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < cfg.device_count; i++)
        if (cfg.devices[i].domain == domain && cfg.devices[i].bus == bus && cfg.devices[i].dev == dev) {
            *device = &cfg.devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- per-device queries ---- */
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER1("nvmlDeviceGetName", device);
    return copy_string(name, length, device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER1("nvmlDeviceGetUUID", device);
    return copy_string(uuid, length, device->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    ENTER1("nvmlDeviceGetIndex", device);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    ENTER1("nvmlDeviceGetMinorNumber", device);
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->minor_number == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *minor = (unsigned int)device->minor_number;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ENTER1("nvmlDeviceGetMemoryInfo", device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory_total;
    memory->used = device->memory_reserved + device->memory_used;
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ENTER1("nvmlDeviceGetMemoryInfo_v2", device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory_total;
    memory->reserved = device->memory_reserved;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_reserved - device->memory_used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER1("nvmlDeviceGetPciInfo_v3", device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->dev;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    /* NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT / NVML_DEVICE_PCI_BUS_ID_FMT */
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", device->domain & 0xFFFFu, device->bus & 0xFFu, device->dev & 0xFFu);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", device->domain, device->bus & 0xFFu, device->dev & 0xFFu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    ENTER1("nvmlDeviceGetCudaComputeCapability", device);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

static nvmlReturn_t power_value(long long value, unsigned int *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (value == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    ENTER1("nvmlDeviceGetPowerManagementLimit", device);
    return power_value(device->power_limit_mw, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    ENTER1("nvmlDeviceGetEnforcedPowerLimit", device);
    return power_value(device->enforced_power_limit_mw, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    ENTER1("nvmlDeviceGetPowerManagementDefaultLimit", device);
    return power_value(device->default_power_limit_mw, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    ENTER1("nvmlDeviceGetMigMode", device);
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = device->mig_current;
    *pending = device->mig_pending;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: a NULL/short buffer gets the count and INSUFFICIENT_SIZE. */
static nvmlReturn_t running_processes(const char *call, nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    int i;
    ENTER1(call, device);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->process_count == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *count < (unsigned int)device->process_count) {
        *count = (unsigned int)device->process_count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < device->process_count; i++) {
        infos[i].pid = device->process_pid[i];
        infos[i].usedGpuMemory = device->process_used[i];
        infos[i].gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* no MIG instance */
        infos[i].computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    }
    *count = (unsigned int)device->process_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos);
}

/* ---- topology ---- */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level)
{
    ENTER2("nvmlDeviceGetTopologyCommonAncestor", a, b);
    if (!a || !b || !level)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a == b) {
        *level = 0; /* NVML_TOPOLOGY_INTERNAL */
        return NVML_SUCCESS;
    }
    if (!cfg.has_pair[a->index][b->index])
        return NVML_ERROR_NOT_SUPPORTED;
    *level = cfg.topology[a->index][b->index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int cap_index, int *status)
{
    ENTER2("nvmlDeviceGetP2PStatus", a, b);
    if (!a || !b || !status || cap_index < 0 || cap_index > 5)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (cap_index >= P2P_CAPS || a == b || !cfg.has_pair[a->index][b->index]) {
        *status = 5; /* NVML_P2P_STATUS_NOT_SUPPORTED */
        return NVML_SUCCESS;
    }
    *status = cfg.p2p[a->index][b->index][cap_index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *is_active)
{
    ENTER1("nvmlDeviceGetNvLinkState", device);
    if (!is_active)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->nvlink_count < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)device->nvlink_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_active = device->nvlink_active[link];
    return NVML_SUCCESS;
}

/* ---- field values: only NVML_FI_DEV_NVLINK_LINK_COUNT answers (GPUStack reads NVLink
 * through it); every other field carries its own NOT_SUPPORTED, as real NVML does. ---- */
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType; /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    union {
        double dVal;
        unsigned int uiVal;
        unsigned long ulVal;
        unsigned long long ullVal;
        long long sllVal;
        int siVal;
        unsigned short usVal;
    } value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values)
{
    int i;
    ENTER1("nvmlDeviceGetFieldValues", device);
    if (count < 0 || (count > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = 0;
        v->latencyUsec = 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT && device->nvlink_count >= 0) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.ullVal = 0;
            v->value.uiVal = (unsigned int)device->nvlink_count;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* ---- optional calls GPUStack 2.3's NVIDIA detector makes (gpustack-runtime detector/nvidia.py; docs/lab.md):
 * exported so symbol lookup succeeds, answering NOT_SUPPORTED, which that detector tolerates. ---- */
#define NOT_SUPPORTED_CALL(name, params)         \
    EXPORT nvmlReturn_t name params              \
    {                                            \
        if (init_refcount == 0)                  \
            return NVML_ERROR_UNINITIALIZED;     \
        return NVML_ERROR_NOT_SUPPORTED;         \
    }

NOT_SUPPORTED_CALL(nvmlDeviceGetMemoryAffinity, (nvmlDevice_t d, unsigned int n, unsigned long *set, int scope))
NOT_SUPPORTED_CALL(nvmlDeviceGetCpuAffinity, (nvmlDevice_t d, unsigned int n, unsigned long *set))
NOT_SUPPORTED_CALL(nvmlDeviceGetNumGpuCores, (nvmlDevice_t d, unsigned int *cores))
NOT_SUPPORTED_CALL(nvmlDeviceGetGpuFabricInfoV, (nvmlDevice_t d, void *info))
NOT_SUPPORTED_CALL(nvmlGpmQueryDeviceSupport, (nvmlDevice_t d, void *support))
NOT_SUPPORTED_CALL(nvmlDeviceGetMemoryErrorCounter, (nvmlDevice_t d, int error_type, int counter_type, int location, unsigned long long *count))
NOT_SUPPORTED_CALL(nvmlDeviceGetUtilizationRates, (nvmlDevice_t d, void *utilization))
NOT_SUPPORTED_CALL(nvmlDeviceGetTemperature, (nvmlDevice_t d, int sensor, unsigned int *temp))
NOT_SUPPORTED_CALL(nvmlDeviceGetPowerUsage, (nvmlDevice_t d, unsigned int *milliwatts))
NOT_SUPPORTED_CALL(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t d, unsigned int *count))
NOT_SUPPORTED_CALL(nvmlDeviceGetMigDeviceHandleByIndex, (nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig))
NOT_SUPPORTED_CALL(nvmlDeviceGetTopologyNearestGpus, (nvmlDevice_t d, int level, unsigned int *count, nvmlDevice_t *devices))
