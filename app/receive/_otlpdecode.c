/* The native OTLP logs decoder: ExportLogsServiceRequest bytes straight into the raw
 * buffers of the FlatBatch columns (sink.parquet.FLAT_SCHEMA), in one pass, with the
 * GIL released. app/receive/native.py assembles the Arrow arrays; the upb parse and
 * app.receive.otlp.flatten stay the reference (DESIGN.md §3).
 *
 * The rule that keeps it equal to the reference: the decoder only ever answers with
 * columns when it is sure upb accepts the request and flatten would produce the same
 * rows. Anything else -- a wire format upb might read differently, a string that is
 * not UTF-8, an id validate_request refuses, a shape outside the fast path (arrays,
 * kvlists, groups, a singular message sent twice, a known field with another wire
 * type) -- returns a reason code and the caller takes the upb path, which decides and
 * words the refusal. So no refusal message is ever made here.
 *
 * Parsing is two steps: the pass over the bytes writes every per-record column and
 * keeps each resource's attributes and each scope's name once; the expansion then
 * copies them per row (so the request's limits can be checked between the two, before
 * the one step whose output is not bounded by the input's size).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the decoder copies protobuf fixed64 fields as they are: little-endian hosts only"
#endif

/* ── status codes (native.py names them) ─────────────────────────────────────────── */

enum {
    ST_OK = 0,
    FB_MALFORMED = 1, /* the wire format is doubtful: upb decides (and may refuse) */
    FB_SHAPE = 2,     /* valid, but outside the fast path */
    FB_UTF8 = 3,      /* a string field that is not UTF-8: upb refuses */
    FB_ID = 4,        /* a trace/span id of a length validate_request refuses */
    FB_SIZE = 5,      /* a column past Arrow's 32-bit offsets */
    ST_LIMIT = 6,     /* a count (or the expanded bytes) over the limits the caller passed */
    ST_NOMEM = 7,
};

/* What the request holds, as the receivers' limits (app.receive.otlp.RequestLimits)
 * count it, in the order of native.Counts. Attributes are counted as sent (duplicates
 * included); scope attributes and bodies are not counted, except in C_EXPANDED. */
#define NCOUNTS 8
enum {
    C_RECORDS,
    C_RESOURCE_LOGS,
    C_SCOPE_LOGS,
    C_ATTRS_MAX,       /* most attributes of one record or one resource */
    C_ENTRIES,         /* each record's attributes plus its resource's */
    C_KEY_BYTES_MAX,   /* longest record or resource attribute key, UTF-8 bytes */
    C_VALUE_BYTES_MAX, /* longest such value as the column holds it, UTF-8 bytes */
    C_EXPANDED,        /* the string bytes the rows hold: each record's severity text,
                        * body and attributes, its resource's attributes and its scope's
                        * name (the last two once a row), as the columns hold them */
};
/* The limits, in RequestLimits' order: records (which bounds the resource_logs and
 * scope_logs too), attributes per record (and per resource), attributes per request
 * (C_ENTRIES), key bytes, value bytes, expanded bytes (C_EXPANDED). */
#define NLIMITS 6

/* ── growable buffers (malloc: they are filled without the GIL) ──────────────────── */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    size_t want = b->len + extra;
    if (want < b->len) return ST_NOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want) {
        if (cap > SIZE_MAX / 2) return ST_NOMEM;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return ST_NOMEM;
    b->p = p;
    b->cap = cap;
    return ST_OK;
}

#define TRY(expr)                   \
    do {                            \
        int st_ = (expr);           \
        if (st_ != ST_OK) return st_; \
    } while (0)

static inline int need(Buf *b, size_t n) {
    return (b->cap - b->len >= n) ? ST_OK : buf_grow(b, n);
}

static inline int put(Buf *b, const void *src, size_t n) {
    TRY(need(b, n));
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return ST_OK;
}

static inline int put_i32(Buf *b, int64_t v) {
    if (v > INT32_MAX) return FB_SIZE;
    int32_t x = (int32_t)v;
    return put(b, &x, 4);
}

#define I32_AT(buf, i) (((int32_t *)(buf).p)[i])

/* ── the wire format ─────────────────────────────────────────────────────────────── */

typedef struct {
    const uint8_t *p, *end;
} Rd;

static inline int rd_varint(Rd *r, uint64_t *out) {
    const uint8_t *p = r->p;
    if (p < r->end && !(*p & 0x80)) {
        *out = *p;
        r->p = p + 1;
        return ST_OK;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= r->end) return FB_MALFORMED;
        uint8_t b = *p++;
        /* upb drops a tenth byte's high bits; no encoder writes them: upb decides. */
        if (i == 9 && b > 1) return FB_MALFORMED;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            r->p = p;
            *out = v;
            return ST_OK;
        }
    }
    return FB_MALFORMED;
}

static inline int rd_tag(Rd *r, uint32_t *field, int *wt) {
    const uint8_t *start = r->p;
    uint64_t v;
    TRY(rd_varint(r, &v));
    /* upb: a tag is at most 5 bytes and 32 bits; field number 0 and wire types 6 and 7
     * are corrupt. */
    if (r->p - start > 5 || v > UINT32_MAX || (v >> 3) == 0 || (v & 7) > 5) return FB_MALFORMED;
    *field = (uint32_t)(v >> 3);
    *wt = (int)(v & 7);
    return ST_OK;
}

static inline int rd_len(Rd *r, Rd *sub) {
    const uint8_t *start = r->p;
    uint64_t v;
    TRY(rd_varint(r, &v));
    if (r->p - start > 5 || v >= INT32_MAX || v > (uint64_t)(r->end - r->p)) return FB_MALFORMED;
    sub->p = r->p;
    sub->end = r->p + v;
    r->p += v;
    return ST_OK;
}

static inline int rd_fixed(Rd *r, void *out, size_t n) {
    if ((size_t)(r->end - r->p) < n) return FB_MALFORMED;
    memcpy(out, r->p, n);
    r->p += n;
    return ST_OK;
}

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };

static int skip_field(Rd *r, int wt) {
    uint64_t v;
    Rd sub;
    switch (wt) {
    case WT_VARINT:
        return rd_varint(r, &v);
    case WT_I64:
        return rd_fixed(r, &v, 8);
    case WT_LEN:
        return rd_len(r, &sub);
    case WT_I32:
        return rd_fixed(r, &v, 4);
    case WT_SGROUP:
        return FB_SHAPE; /* an unknown group: upb parses it, the fast path does not */
    default:
        return FB_MALFORMED;
    }
}

/* Strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF): what upb checks on
 * every proto3 string field. */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c < 0xF0) {
            if (n - i < 3) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            if (c == 0xED && c1 > 0x9F) return 0; /* a surrogate */
            i += 3;
        } else if (c < 0xF5) {
            if (n - i < 4) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0; /* overlong */
            if (c == 0xF4 && c1 > 0x8F) return 0; /* past U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static inline int rd_string(Rd *r, Rd *sub) {
    TRY(rd_len(r, sub));
    return utf8_valid(sub->p, (size_t)(sub->end - sub->p)) ? ST_OK : FB_UTF8;
}

/* ── the decoder's state ─────────────────────────────────────────────────────────── */

enum { K_UNSET = 0, K_STR = 1, K_BOOL = 2, K_INT = 3, K_DOUBLE = 4, K_BYTES = 7, K_STRINDEX = 8 };

typedef struct {
    int kind;
    const uint8_t *s; /* K_STR, K_BYTES */
    size_t n;
    uint64_t u; /* K_BOOL, K_INT; K_DOUBLE's bits */
} AnyVal;

/* One attribute of the record (or resource) being parsed: its key in the input, its
 * value already rendered into a values buffer at [voff, voff + vlen). */
typedef struct {
    const uint8_t *k;
    size_t kn;
    size_t voff, vlen;
    size_t first; /* the index of the first entry with this key (duplicates) */
} Entry;

/* A resource's attributes, deduplicated, kept once: keys and values contiguous in
 * rk/rv, each entry's end relative to the block in rends (two int32 an entry). */
typedef struct {
    size_t ent, count;  /* entries [ent, ent + count) of rends */
    size_t kstart, kn;  /* the keys' block in rk */
    size_t vstart, vn;  /* the values' block in rv */
    uint64_t raw;       /* its attributes as sent (the limits count them) */
    uint64_t rows;      /* its records */
    int seen;
} Resource;

typedef struct {
    const uint8_t *s;
    size_t n;
    uint64_t rows; /* its records */
    int seen;
} Scope;

typedef struct {
    /* per-record columns */
    Buf time, observed, severity;
    Buf sevtext_off, sevtext;
    Buf body_off, body;
    Buf attr_off, key_off, key, val_off, val;
    Buf trace_valid, trace_off, trace;
    Buf span_valid, span_off, span;
    int64_t trace_nulls, span_nulls;
    Buf row_res, row_scope; /* int32 a row: the row's resource and scope */
    /* expanded per row */
    Buf res_off, rkey_off, rkey, rval_off, rval;
    Buf scope_off, scope;
    /* kept once */
    Buf resources, scopes; /* Resource, Scope */
    Buf rk, rv, rends;
    /* scratch */
    Buf ents;      /* Entry, the current record's or resource's */
    Buf scratch;   /* values while duplicates are merged */
    Buf hash;      /* size_t slots, for many attributes */
    int64_t rows;
    uint64_t counts[NCOUNTS];
    PyThreadState *released; /* non-NULL while the GIL is released */
    const uint64_t *limits;  /* NLIMITS bounds, or NULL */
} Ctx;

#define BUF_FIELDS(X)                                                                       \
    X(time) X(observed) X(severity) X(sevtext_off) X(sevtext) X(body_off) X(body) X(attr_off) \
    X(key_off) X(key) X(val_off) X(val) X(trace_valid) X(trace_off) X(trace) X(span_valid)   \
    X(span_off) X(span) X(row_res) X(row_scope) X(res_off) X(rkey_off) X(rkey) X(rval_off)   \
    X(rval) X(scope_off) X(scope) X(resources) X(scopes) X(rk) X(rv) X(rends) X(ents)         \
    X(scratch) X(hash)

static void ctx_free(Ctx *c) {
#define FREE_ONE(name) free(c->name.p); c->name.p = NULL;
    BUF_FIELDS(FREE_ONE)
#undef FREE_ONE
}

static void hold_gil(Ctx *c) {
    if (c->released) {
        PyEval_RestoreThread(c->released);
        c->released = NULL;
    }
}

static inline void count_max(Ctx *c, int which, uint64_t v) {
    if (v > c->counts[which]) c->counts[which] = v;
}

/* A limit the parse has already passed stops it: what it holds so far only grows, and a
 * hostile request (millions of attributes on one record) must not grow the scratch
 * buffers before its refusal. The counts are then those reached so far. */
#define OVER(c, count, bound) ((c)->limits && (count) > (c)->limits[bound])

/* ── values ──────────────────────────────────────────────────────────────────────── */

static int parse_anyvalue(Rd *r, AnyVal *out) {
    /* A oneof: the last member on the wire wins, as in upb. */
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        switch (f) {
        case 1:
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
            out->kind = K_STR;
            out->s = sub.p;
            out->n = (size_t)(sub.end - sub.p);
            break;
        case 2:
        case 3:
        case 8:
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(rd_varint(r, &v));
            out->kind = f == 2 ? K_BOOL : f == 3 ? K_INT : K_STRINDEX;
            out->u = v;
            break;
        case 4:
            if (wt != WT_I64) return FB_SHAPE;
            TRY(rd_fixed(r, &v, 8));
            out->kind = K_DOUBLE;
            out->u = v;
            break;
        case 5: /* array_value */
        case 6: /* kvlist_value */
            return FB_SHAPE;
        case 7:
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            out->kind = K_BYTES;
            out->s = sub.p;
            out->n = (size_t)(sub.end - sub.p);
            break;
        default:
            TRY(skip_field(r, wt));
        }
    }
    return ST_OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int put_base64_json(Buf *b, const uint8_t *s, size_t n) {
    /* base64 with padding, as a JSON string: "..." */
    TRY(need(b, 2 + (n + 2) / 3 * 4));
    uint8_t *o = b->p + b->len;
    *o++ = '"';
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t w = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        *o++ = B64[(w >> 18) & 63];
        *o++ = B64[(w >> 12) & 63];
        *o++ = B64[(w >> 6) & 63];
        *o++ = B64[w & 63];
    }
    if (n - i == 1) {
        uint32_t w = (uint32_t)s[i] << 16;
        *o++ = B64[(w >> 18) & 63];
        *o++ = B64[(w >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t w = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
        *o++ = B64[(w >> 18) & 63];
        *o++ = B64[(w >> 12) & 63];
        *o++ = B64[(w >> 6) & 63];
        *o++ = '=';
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return ST_OK;
}

static int put_int(Buf *b, int64_t x) {
    char tmp[24];
    char *e = tmp + sizeof tmp, *q = e;
    uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (x < 0) *--q = '-';
    return put(b, q, (size_t)(e - q));
}

static int put_double(Ctx *c, Buf *b, uint64_t bits) {
    double x;
    memcpy(&x, &bits, 8);
    if (isnan(x)) return put(b, "\"NaN\"", 5);
    if (isinf(x)) return x > 0 ? put(b, "\"Infinity\"", 10) : put(b, "\"-Infinity\"", 11);
    /* json renders a float with float.__repr__: this is that function's own code. It
     * needs the GIL, so the first double takes it back for the rest of the request (one
     * wait at most, never one a value). */
    hold_gil(c);
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text) {
        PyErr_Clear();
        return ST_NOMEM;
    }
    int st = put(b, text, strlen(text));
    PyMem_Free(text);
    return st;
}

/* The text flatten gives a top-level body or attribute value (otlp._value_text). */
static int render(Ctx *c, Buf *b, const AnyVal *v) {
    switch (v->kind) {
    case K_STR:
        return put(b, v->s, v->n);
    case K_BOOL:
        return v->u ? put(b, "true", 4) : put(b, "false", 5);
    case K_INT:
        return put_int(b, (int64_t)v->u);
    case K_DOUBLE:
        return put_double(c, b, v->u);
    case K_BYTES:
        return put_base64_json(b, v->s, v->n);
    default: /* unset, string_value_strindex */
        return ST_OK;
    }
}

/* One KeyValue. With `vals`, its value is rendered there and appended to c->ents as
 * an Entry; without, it is only validated (scope attributes: not flattened). */
static int parse_keyvalue(Ctx *c, Rd *r, Buf *vals) {
    const uint8_t *k = NULL;
    size_t kn = 0;
    AnyVal v = {0};
    int have_value = 0;
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1) {
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
            k = sub.p;
            kn = (size_t)(sub.end - sub.p);
        } else if (f == 2) {
            if (wt != WT_LEN || have_value) return FB_SHAPE; /* twice: upb merges */
            have_value = 1;
            TRY(rd_len(r, &sub));
            TRY(parse_anyvalue(&sub, &v));
        } else if (f == 3) { /* key_strindex */
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(skip_field(r, wt));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    if (!vals) return ST_OK;
    Entry e = {k, kn, vals->len, 0, 0};
    TRY(render(c, vals, &v));
    e.vlen = vals->len - e.voff;
    count_max(c, C_KEY_BYTES_MAX, kn);
    count_max(c, C_VALUE_BYTES_MAX, e.vlen);
    if (OVER(c, kn, 3) || OVER(c, e.vlen, 4)) return ST_LIMIT;
    return put(&c->ents, &e, sizeof e);
}

/* ── duplicated keys: first position, last value (otlp._unique_keys) ─────────────── */

static inline int same_key(const Entry *a, const Entry *b) {
    return a->kn == b->kn && (a->kn == 0 || memcmp(a->k, b->k, a->kn) == 0);
}

static uint64_t key_hash(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

/* Sets every entry's `first`; returns whether any key repeats. */
static int find_duplicates(Ctx *c, Entry *e, size_t n, int *dup) {
    *dup = 0;
    if (n < 24) {
        for (size_t i = 0; i < n; i++) {
            e[i].first = i;
            for (size_t j = 0; j < i; j++) {
                if (same_key(&e[j], &e[i])) {
                    e[i].first = e[j].first;
                    *dup = 1;
                    break;
                }
            }
        }
        return ST_OK;
    }
    size_t slots = 64;
    while (slots < 2 * n) slots *= 2;
    c->hash.len = 0;
    TRY(need(&c->hash, slots * sizeof(size_t)));
    size_t *t = (size_t *)c->hash.p;
    for (size_t s = 0; s < slots; s++) t[s] = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t s = (size_t)key_hash(e[i].k, e[i].kn) & (slots - 1);
        e[i].first = i;
        while (t[s] != SIZE_MAX) {
            if (same_key(&e[t[s]], &e[i])) {
                e[i].first = t[s];
                *dup = 1;
                break;
            }
            s = (s + 1) & (slots - 1);
        }
        if (e[i].first == i) t[s] = i;
    }
    return ST_OK;
}

/* Merges duplicates among the `n` entries whose values fill vals[base:]: afterwards
 * the live entries come first, in order, and their values are contiguous again. */
static int merge_duplicates(Ctx *c, Entry *e, size_t *n, Buf *vals, size_t base) {
    int dup;
    TRY(find_duplicates(c, e, *n, &dup));
    if (!dup) return ST_OK;
    for (size_t i = 0; i < *n; i++) {
        if (e[i].first != i) {
            e[e[i].first].voff = e[i].voff;
            e[e[i].first].vlen = e[i].vlen;
        }
    }
    c->scratch.len = 0;
    TRY(put(&c->scratch, vals->p + base, vals->len - base));
    vals->len = base;
    size_t live = 0;
    for (size_t i = 0; i < *n; i++) {
        if (e[i].first != i) continue;
        Entry x = e[i];
        x.voff = vals->len;
        TRY(put(vals, c->scratch.p + (e[i].voff - base), e[i].vlen));
        e[live++] = x;
    }
    *n = live;
    return ST_OK;
}

/* ── messages ────────────────────────────────────────────────────────────────────── */

static int parse_entity_ref(Rd *r) {
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f >= 1 && f <= 4) { /* schema_url, type, id_keys, description_keys */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    return ST_OK;
}

static int parse_resource(Ctx *c, Rd *r, size_t index) {
    size_t base = c->rv.len;
    c->ents.len = 0;
    uint64_t raw = 0;
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1) {
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_keyvalue(c, &sub, &c->rv));
            raw++;
            if (OVER(c, raw, 1)) return ST_LIMIT;
        } else if (f == 2) { /* dropped_attributes_count */
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(skip_field(r, wt));
        } else if (f == 3) { /* entity_refs */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_entity_ref(&sub));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    count_max(c, C_ATTRS_MAX, raw);
    Entry *e = (Entry *)c->ents.p;
    size_t n = c->ents.len / sizeof(Entry);
    TRY(merge_duplicates(c, e, &n, &c->rv, base));
    Resource *res = &((Resource *)c->resources.p)[index];
    res->ent = c->rends.len / 8;
    res->count = n;
    res->kstart = c->rk.len;
    res->vstart = base;
    size_t kn = 0;
    for (size_t i = 0; i < n; i++) {
        TRY(put(&c->rk, e[i].k, e[i].kn));
        kn += e[i].kn;
        int64_t ends[2] = {(int64_t)kn, (int64_t)(e[i].voff + e[i].vlen - base)};
        TRY(put_i32(&c->rends, ends[0]));
        TRY(put_i32(&c->rends, ends[1]));
    }
    res->kn = kn;
    res->vn = c->rv.len - base;
    res->raw = raw;
    return ST_OK;
}

static int parse_scope(Ctx *c, Rd *r, size_t index) {
    const uint8_t *name = NULL;
    size_t n = 0;
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1 || f == 2) { /* name, version */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
            if (f == 1) {
                name = sub.p;
                n = (size_t)(sub.end - sub.p);
            }
        } else if (f == 3) { /* attributes: checked, not flattened */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_keyvalue(c, &sub, NULL));
        } else if (f == 4) {
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(skip_field(r, wt));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    Scope *s = &((Scope *)c->scopes.p)[index];
    s->s = name;
    s->n = n;
    return ST_OK;
}

static const char HEX[] = "0123456789abcdef";

static int put_id(Buf *valid, Buf *off, Buf *data, int64_t *nulls, int64_t row,
                  const uint8_t *id, size_t n) {
    if ((size_t)(row / 8) >= valid->len) {
        uint8_t zero = 0;
        TRY(put(valid, &zero, 1));
    }
    if (n) {
        valid->p[row / 8] |= (uint8_t)(1u << (row % 8));
        TRY(need(data, 2 * n));
        uint8_t *o = data->p + data->len;
        for (size_t i = 0; i < n; i++) {
            *o++ = (uint8_t)HEX[id[i] >> 4];
            *o++ = (uint8_t)HEX[id[i] & 15];
        }
        data->len += 2 * n;
    } else {
        (*nulls)++;
    }
    return put_i32(off, (int64_t)data->len);
}

static int parse_record(Ctx *c, Rd *r, size_t res_index, size_t scope_index) {
    uint64_t time = 0, observed = 0;
    int32_t severity = 0;
    const uint8_t *sevtext = NULL, *trace = NULL, *span = NULL;
    size_t sevtext_n = 0, trace_n = 0, span_n = 0;
    AnyVal body = {0};
    int have_body = 0;
    size_t base = c->val.len;
    c->ents.len = 0;
    uint64_t raw = 0;
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        switch (f) {
        case 1: /* time_unix_nano */
        case 11: /* observed_time_unix_nano */
            if (wt != WT_I64) return FB_SHAPE;
            TRY(rd_fixed(r, f == 1 ? &time : &observed, 8));
            break;
        case 2: /* severity_number: an open enum, int32 */
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(rd_varint(r, &v));
            severity = (int32_t)(uint32_t)v;
            break;
        case 3: /* severity_text */
        case 12: /* event_name: checked, not flattened */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
            if (f == 3) {
                sevtext = sub.p;
                sevtext_n = (size_t)(sub.end - sub.p);
            }
            break;
        case 5: /* body */
            if (wt != WT_LEN || have_body) return FB_SHAPE; /* twice: upb merges */
            have_body = 1;
            TRY(rd_len(r, &sub));
            TRY(parse_anyvalue(&sub, &body));
            break;
        case 6: /* attributes */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_keyvalue(c, &sub, &c->val));
            raw++;
            if (OVER(c, raw, 1) || OVER(c, c->counts[C_ENTRIES] + raw, 2)) return ST_LIMIT;
            break;
        case 7: /* dropped_attributes_count */
            if (wt != WT_VARINT) return FB_SHAPE;
            TRY(skip_field(r, wt));
            break;
        case 8: /* flags */
            if (wt != WT_I32) return FB_SHAPE;
            TRY(skip_field(r, wt));
            break;
        case 9: /* trace_id */
        case 10: /* span_id */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            if (f == 9) {
                trace = sub.p;
                trace_n = (size_t)(sub.end - sub.p);
            } else {
                span = sub.p;
                span_n = (size_t)(sub.end - sub.p);
            }
            break;
        default:
            TRY(skip_field(r, wt));
        }
    }
    /* validate_request: an id is empty or of its OTLP length. */
    if ((trace_n && trace_n != 16) || (span_n && span_n != 8)) return FB_ID;

    int64_t row = c->rows++;
    c->counts[C_RECORDS]++;
    if (OVER(c, c->counts[C_RECORDS], 0)) return ST_LIMIT;
    c->counts[C_ENTRIES] += raw;
    count_max(c, C_ATTRS_MAX, raw);
    ((Resource *)c->resources.p)[res_index].rows++;
    ((Scope *)c->scopes.p)[scope_index].rows++;
    TRY(put(&c->time, &time, 8));
    TRY(put(&c->observed, &observed, 8));
    TRY(put(&c->severity, &severity, 4));
    TRY(put(&c->sevtext, sevtext, sevtext_n));
    TRY(put_i32(&c->sevtext_off, (int64_t)c->sevtext.len));
    TRY(render(c, &c->body, &body));
    TRY(put_i32(&c->body_off, (int64_t)c->body.len));

    Entry *e = (Entry *)c->ents.p;
    size_t n = c->ents.len / sizeof(Entry);
    if (n > 1) TRY(merge_duplicates(c, e, &n, &c->val, base));
    for (size_t i = 0; i < n; i++) {
        TRY(put(&c->key, e[i].k, e[i].kn));
        TRY(put_i32(&c->key_off, (int64_t)c->key.len));
        TRY(put_i32(&c->val_off, (int64_t)(e[i].voff + e[i].vlen)));
    }
    TRY(put_i32(&c->attr_off, (int64_t)(c->key_off.len / 4 - 1)));

    TRY(put_id(&c->trace_valid, &c->trace_off, &c->trace, &c->trace_nulls, row, trace, trace_n));
    TRY(put_id(&c->span_valid, &c->span_off, &c->span, &c->span_nulls, row, span, span_n));
    TRY(put_i32(&c->row_res, (int64_t)res_index));
    TRY(put_i32(&c->row_scope, (int64_t)scope_index));
    return ST_OK;
}

static int parse_scope_logs(Ctx *c, Rd *r, size_t res_index) {
    size_t index = c->scopes.len / sizeof(Scope);
    c->counts[C_SCOPE_LOGS]++;
    if (OVER(c, c->counts[C_SCOPE_LOGS], 0)) return ST_LIMIT;
    Scope blank = {NULL, 0, 0, 0};
    TRY(put(&c->scopes, &blank, sizeof blank));
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1) {
            Scope *s = &((Scope *)c->scopes.p)[index];
            if (wt != WT_LEN || s->seen) return FB_SHAPE; /* twice: upb merges */
            s->seen = 1;
            TRY(rd_len(r, &sub));
            TRY(parse_scope(c, &sub, index));
        } else if (f == 2) {
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_record(c, &sub, res_index, index));
        } else if (f == 3) { /* schema_url */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    return ST_OK;
}

static int parse_resource_logs(Ctx *c, Rd *r) {
    size_t index = c->resources.len / sizeof(Resource);
    c->counts[C_RESOURCE_LOGS]++;
    if (OVER(c, c->counts[C_RESOURCE_LOGS], 0)) return ST_LIMIT;
    Resource blank = {0};
    TRY(put(&c->resources, &blank, sizeof blank));
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1) {
            Resource *res = &((Resource *)c->resources.p)[index];
            if (wt != WT_LEN || res->seen) return FB_SHAPE; /* twice: upb merges */
            res->seen = 1;
            TRY(rd_len(r, &sub));
            TRY(parse_resource(c, &sub, index));
        } else if (f == 2) {
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_scope_logs(c, &sub, index));
        } else if (f == 3) { /* schema_url */
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_string(r, &sub));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    return ST_OK;
}

static int parse_request(Ctx *c, Rd *r) {
    while (r->p < r->end) {
        uint32_t f;
        int wt;
        Rd sub;
        TRY(rd_tag(r, &f, &wt));
        if (f == 1) {
            if (wt != WT_LEN) return FB_SHAPE;
            TRY(rd_len(r, &sub));
            TRY(parse_resource_logs(c, &sub));
        } else {
            TRY(skip_field(r, wt));
        }
    }
    return ST_OK;
}

/* Resource attributes and scope names per row: sizes summed first (Arrow's offsets are
 * 32-bit), each buffer allocated once. */
static int expand(Ctx *c) {
    const Resource *res = (const Resource *)c->resources.p;
    const Scope *scopes = (const Scope *)c->scopes.p;
    const int32_t *rows_res = (const int32_t *)c->row_res.p;
    const int32_t *rows_scope = (const int32_t *)c->row_scope.p;
    uint64_t entries = 0, kbytes = 0, vbytes = 0, sbytes = 0;
    for (int64_t i = 0; i < c->rows; i++) {
        const Resource *x = &res[rows_res[i]];
        entries += x->count;
        kbytes += x->kn;
        vbytes += x->vn;
        sbytes += scopes[rows_scope[i]].n;
    }
    if (entries > INT32_MAX || kbytes > INT32_MAX || vbytes > INT32_MAX || sbytes > INT32_MAX)
        return FB_SIZE;
    TRY(need(&c->res_off, 4 * (size_t)(c->rows + 1)));
    TRY(need(&c->rkey_off, 4 * (size_t)(entries + 1)));
    TRY(need(&c->rval_off, 4 * (size_t)(entries + 1)));
    TRY(need(&c->rkey, (size_t)kbytes));
    TRY(need(&c->rval, (size_t)vbytes));
    TRY(need(&c->scope_off, 4 * (size_t)(c->rows + 1)));
    TRY(need(&c->scope, (size_t)sbytes));
    int32_t *res_off = (int32_t *)c->res_off.p;
    int32_t *kof = (int32_t *)c->rkey_off.p;
    int32_t *vof = (int32_t *)c->rval_off.p;
    int32_t *sof = (int32_t *)c->scope_off.p;
    const int32_t *ends = (const int32_t *)c->rends.p;
    size_t e = 0, kpos = 0, vpos = 0, spos = 0;
    res_off[0] = kof[0] = vof[0] = sof[0] = 0;
    for (int64_t i = 0; i < c->rows; i++) {
        const Resource *x = &res[rows_res[i]];
        if (x->kn) memcpy(c->rkey.p + kpos, c->rk.p + x->kstart, x->kn);
        if (x->vn) memcpy(c->rval.p + vpos, c->rv.p + x->vstart, x->vn);
        for (size_t j = 0; j < x->count; j++) {
            kof[e + 1 + j] = (int32_t)(kpos + (size_t)ends[2 * (x->ent + j)]);
            vof[e + 1 + j] = (int32_t)(vpos + (size_t)ends[2 * (x->ent + j) + 1]);
        }
        e += x->count;
        kpos += x->kn;
        vpos += x->vn;
        res_off[i + 1] = (int32_t)e;
        const Scope *s = &scopes[rows_scope[i]];
        if (s->n) memcpy(c->scope.p + spos, s->s, s->n);
        spos += s->n;
        sof[i + 1] = (int32_t)spos;
    }
    c->res_off.len = 4 * (size_t)(c->rows + 1);
    c->rkey_off.len = c->rval_off.len = 4 * (e + 1);
    c->rkey.len = kpos;
    c->rval.len = vpos;
    c->scope_off.len = 4 * (size_t)(c->rows + 1);
    c->scope.len = spos;
    return ST_OK;
}

static int start_offsets(Ctx *c) {
    Buf *starts[] = {&c->sevtext_off, &c->body_off, &c->attr_off, &c->key_off,
                     &c->val_off, &c->trace_off, &c->span_off};
    for (size_t i = 0; i < sizeof starts / sizeof *starts; i++) TRY(put_i32(starts[i], 0));
    return ST_OK;
}

static int decode(Ctx *c, const uint8_t *data, size_t n, const uint64_t *limits) {
    c->limits = limits;
    Rd r = {data, data + n};
    TRY(start_offsets(c));
    TRY(parse_request(c, &r));
    /* Every row repeats its resource's attributes and its scope's name: what they will
     * hold is known from the sizes kept once, before anything is copied per row. */
    const Resource *res = (const Resource *)c->resources.p;
    uint64_t expanded = c->sevtext.len + c->body.len + c->key.len + c->val.len;
    for (size_t i = 0; i < c->resources.len / sizeof(Resource); i++) {
        c->counts[C_ENTRIES] += res[i].raw * res[i].rows;
        expanded += (res[i].kn + res[i].vn) * res[i].rows;
    }
    const Scope *scopes = (const Scope *)c->scopes.p;
    for (size_t i = 0; i < c->scopes.len / sizeof(Scope); i++)
        expanded += scopes[i].n * scopes[i].rows;
    c->counts[C_EXPANDED] = expanded;
    if (limits) {
        /* Before the expansion, the one step whose output the input's size does not
         * bound: what RequestLimits.check_counts and flatten's checks refuse. */
        const uint64_t *n = c->counts;
        if (n[C_RECORDS] > limits[0] || n[C_RESOURCE_LOGS] > limits[0] ||
            n[C_SCOPE_LOGS] > limits[0] || n[C_ATTRS_MAX] > limits[1] ||
            n[C_ENTRIES] > limits[2] || n[C_KEY_BYTES_MAX] > limits[3] ||
            n[C_VALUE_BYTES_MAX] > limits[4] || n[C_EXPANDED] > limits[5])
            return ST_LIMIT;
    }
    return expand(c);
}

/* ── the Python side ─────────────────────────────────────────────────────────────── */

/* A read-only buffer over memory the decoder filled; Arrow wraps it without a copy and
 * keeps it alive while an array uses it. */
typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t n;
} Block;

static uint8_t EMPTY_BYTES[8];

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->p ? b->p : EMPTY_BYTES, b->n, 1, flags);
}

static void block_dealloc(PyObject *self) {
    free(((Block *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_as_buffer = {block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "app.receive._otlpdecode.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_as_buffer = &block_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory the decoder filled (the buffer protocol, read-only).",
};

static PyObject *take_block(Buf *b) {
    Block *o = PyObject_New(Block, &BlockType);
    if (!o) return NULL;
    o->p = b->p;
    o->n = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static PyObject *counts_tuple(const Ctx *c) {
    PyObject *t = PyTuple_New(NCOUNTS);
    if (!t) return NULL;
    for (int i = 0; i < NCOUNTS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(c->counts[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* The column buffers in native.py's order. */
#define COLUMN_BUFS(X)                                                                      \
    X(time) X(observed) X(severity) X(sevtext_off) X(sevtext) X(body_off) X(body) X(attr_off) \
    X(key_off) X(key) X(val_off) X(val) X(res_off) X(rkey_off) X(rkey) X(rval_off) X(rval)   \
    X(scope_off) X(scope) X(trace_valid) X(trace_off) X(trace) X(span_valid) X(span_off)     \
    X(span)

static PyObject *result(Ctx *c) {
    PyObject *blocks = PyList_New(0);
    if (!blocks) return NULL;
#define ADD_ONE(name)                                                   \
    {                                                                   \
        PyObject *b_ = take_block(&c->name);                            \
        if (!b_ || PyList_Append(blocks, b_) < 0) {                     \
            Py_XDECREF(b_);                                             \
            Py_DECREF(blocks);                                          \
            return NULL;                                                \
        }                                                               \
        Py_DECREF(b_);                                                  \
    }
    COLUMN_BUFS(ADD_ONE)
#undef ADD_ONE
    PyObject *counts = counts_tuple(c);
    if (!counts) {
        Py_DECREF(blocks);
        return NULL;
    }
    return Py_BuildValue("(iLNNLL)", ST_OK, (long long)c->rows, counts, blocks,
                         (long long)c->trace_nulls, (long long)c->span_nulls);
}

/* The GIL is released for a request of at least this many bytes: below it the pass
 * takes about as long as handing the interpreter over. */
#define RELEASE_BYTES 4096

PyDoc_STRVAR(decode_doc,
"decode(data, limits=None, /)\n--\n\n"
"Decode an ExportLogsServiceRequest. Returns (0, rows, counts, buffers, trace_nulls,\n"
"span_nulls) on success; (code, counts) when the request is not decoded here: code is\n"
"a fallback reason, or LIMIT when the request exceeds `limits` (records, attributes per\n"
"record, attributes per request, key bytes, value bytes, expanded bytes: RequestLimits'\n"
"order), found as soon as the parse passes it and before the resource attributes are\n"
"copied per row (the counts are then those reached so far).");

static PyObject *py_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "decode(data, limits=None)");
        return NULL;
    }
    uint64_t limits[NLIMITS];
    int have_limits = nargs == 2 && args[1] != Py_None;
    if (have_limits) {
        PyObject *seq = PySequence_Fast(args[1], "limits must be a sequence");
        if (!seq) return NULL;
        if (PySequence_Fast_GET_SIZE(seq) != NLIMITS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "limits must hold %d bounds", NLIMITS);
            return NULL;
        }
        for (int i = 0; i < NLIMITS; i++) {
            limits[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (limits[i] == (uint64_t)-1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
        }
        Py_DECREF(seq);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    if (view.len >= RELEASE_BYTES) c.released = PyEval_SaveThread();
    int st = decode(&c, (const uint8_t *)view.buf, (size_t)view.len, have_limits ? limits : NULL);
    hold_gil(&c);
    PyBuffer_Release(&view);
    PyObject *out;
    if (st == ST_OK) {
        out = result(&c);
    } else if (st == ST_NOMEM) {
        out = PyErr_NoMemory();
    } else {
        PyObject *counts = counts_tuple(&c);
        out = counts ? Py_BuildValue("(iN)", st, counts) : NULL;
    }
    ctx_free(&c);
    return out;
}

/* The schema the pass assumes: (message, field number, descriptor type) for every
 * field of every message it reads. native.py compares it with the installed
 * opentelemetry-proto's descriptors and keeps the upb path if they differ (a field
 * added upstream would be skipped here as unknown but checked by upb). */
#define LOGS "opentelemetry.proto.logs.v1."
#define COMMON "opentelemetry.proto.common.v1."
static const struct {
    const char *message;
    int number, type;
} SCHEMA[] = {
    {"opentelemetry.proto.collector.logs.v1.ExportLogsServiceRequest", 1, 11},
    {LOGS "ResourceLogs", 1, 11}, {LOGS "ResourceLogs", 2, 11}, {LOGS "ResourceLogs", 3, 9},
    {"opentelemetry.proto.resource.v1.Resource", 1, 11},
    {"opentelemetry.proto.resource.v1.Resource", 2, 13},
    {"opentelemetry.proto.resource.v1.Resource", 3, 11},
    {COMMON "EntityRef", 1, 9}, {COMMON "EntityRef", 2, 9}, {COMMON "EntityRef", 3, 9},
    {COMMON "EntityRef", 4, 9},
    {LOGS "ScopeLogs", 1, 11}, {LOGS "ScopeLogs", 2, 11}, {LOGS "ScopeLogs", 3, 9},
    {COMMON "InstrumentationScope", 1, 9}, {COMMON "InstrumentationScope", 2, 9},
    {COMMON "InstrumentationScope", 3, 11}, {COMMON "InstrumentationScope", 4, 13},
    {LOGS "LogRecord", 1, 6}, {LOGS "LogRecord", 2, 14}, {LOGS "LogRecord", 3, 9},
    {LOGS "LogRecord", 5, 11}, {LOGS "LogRecord", 6, 11}, {LOGS "LogRecord", 7, 13},
    {LOGS "LogRecord", 8, 7}, {LOGS "LogRecord", 9, 12}, {LOGS "LogRecord", 10, 12},
    {LOGS "LogRecord", 11, 6}, {LOGS "LogRecord", 12, 9},
    {COMMON "KeyValue", 1, 9}, {COMMON "KeyValue", 2, 11}, {COMMON "KeyValue", 3, 5},
    {COMMON "AnyValue", 1, 9}, {COMMON "AnyValue", 2, 8}, {COMMON "AnyValue", 3, 3},
    {COMMON "AnyValue", 4, 1}, {COMMON "AnyValue", 5, 11}, {COMMON "AnyValue", 6, 11},
    {COMMON "AnyValue", 7, 12}, {COMMON "AnyValue", 8, 5},
};

static PyObject *schema(void) {
    size_t n = sizeof SCHEMA / sizeof *SCHEMA;
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (!t) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *row = Py_BuildValue("(sii)", SCHEMA[i].message, SCHEMA[i].number, SCHEMA[i].type);
        if (!row) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, row);
    }
    return t;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "app.receive._otlpdecode",
    .m_doc = "The native OTLP logs decoder (app/receive/native.py wraps it).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__otlpdecode(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    PyObject *s = schema();
    if (!s || PyModule_AddObject(m, "SCHEMA", s) < 0) {
        Py_XDECREF(s);
        Py_DECREF(m);
        return NULL;
    }
    struct {
        const char *name;
        int value;
    } ints[] = {{"OK", ST_OK}, {"MALFORMED", FB_MALFORMED}, {"SHAPE", FB_SHAPE},
                {"UTF8", FB_UTF8}, {"ID", FB_ID}, {"SIZE", FB_SIZE}, {"LIMIT", ST_LIMIT}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (PyModule_AddIntConstant(m, ints[i].name, ints[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
