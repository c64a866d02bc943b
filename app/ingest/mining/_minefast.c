/* The miner's fast path (app/ingest/mining/native_miner.py): TenantMiner._mine's loop
 * for the bodies that match a template exactly, over the Python objects the miner keeps.
 *
 * mine(root_children, templates, param, max_node_depth, sim_th, max_chars, max_tokens,
 *      bounded, touch, bodies, ids, params, versions, start, tick)
 *   -> (index, tick, work, found, best_id, compared)
 *
 * (the per-batch arguments first, so Python binds them once with functools.partial;
 * max_chars and max_tokens are -1 when unbounded)
 *
 * From bodies[start] on, each body is split as str.split() splits it, its leaf found as
 * TenantMiner._search finds it (the token-count child of root_children, then at most
 * max_node_depth - 1 tokens, a missing token taking the `param` child), its candidates
 * compared as _search compares them (the same similarity float(same) / count, the best
 * similarity, ties to more wildcards, the first of equals, none below sim_th), and when
 * the best has every one of its constant tokens its id, its parameters and its version
 * are appended, its cluster's size bumped and, when `bounded`, the LRU touched (`touch`,
 * None when there is no LRU), `touched` stamped and the template moved to the recent end
 * of `templates` -- _mine's steps, in its order. At the first body that needs anything
 * else (a creation, a widening, a body over max_chars or max_tokens, no tokens, not a
 * str, a template whose shape is not what this file expects) it stops and returns that
 * body's index: Python mines it with today's code and calls again for the rest.
 *
 * When it stopped after searching that body (a creation or a widening), the search's
 * answer comes with it, so Python does not search again: `found` 0 when no template
 * matches (best_id None), 1 when the template of drain id `best_id` is the best and
 * needs widening, with `compared` the templates compared (_search's third value); -1
 * when it stopped before or without a search Python can take (Python searches).
 *
 * A template's shape is _Template.shape: (fixed, expected, wildcards) where `fixed` is
 * bytes of native-endian uint32 token indices of the constant tokens, `expected` those
 * tokens as _Template.expected holds them (None, the one str, or a tuple), `wildcards`
 * bytes of the wildcard indices (uint32 likewise). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *s_key_to_child_node, *s_cluster_ids, *s_cluster, *s_size, *s_shape;
static PyObject *s_template_id, *s_version, *s_touched;

/* str(n) for the token-count keys of the root, made once. */
#define COUNT_KEYS 256
static PyObject *count_keys[COUNT_KEYS];

static PyObject *count_key(Py_ssize_t n) {
    if (n < COUNT_KEYS) {
        if (count_keys[n] == NULL) {
            count_keys[n] = PyUnicode_FromFormat("%zd", n);
            if (count_keys[n] == NULL) return NULL;
            PyUnicode_InternInPlace(&count_keys[n]);
        }
        Py_INCREF(count_keys[n]);
        return count_keys[n];
    }
    return PyUnicode_FromFormat("%zd", n);
}

/* str == str for two exact, ready strings: equal strings have the same kind (PEP 393's
 * canonical form), so length, kind and bytes decide. */
static int same_str(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    if (n != PyUnicode_GET_LENGTH(b)) return 0;
    int kind = PyUnicode_KIND(a);
    if (kind != PyUnicode_KIND(b)) return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

typedef struct {
    const uint32_t *fixed;
    Py_ssize_t nfixed;
    PyObject *const *expected; /* borrowed: the tuple's items, or the one str */
    const uint32_t *wild;
    Py_ssize_t nwild;
} Shape;

/* 1 and `out` filled, 0 when the template is not of the expected shape (Python decides),
 * -1 with an exception. `holder` receives a new reference that keeps `out` alive. */
static int read_shape(PyObject *template, Py_ssize_t count, Shape *out, PyObject **holder) {
    PyObject *shape = PyObject_GetAttr(template, s_shape);
    if (shape == NULL) return -1;
    *holder = shape;
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != 3) return 0;
    PyObject *fixed = PyTuple_GET_ITEM(shape, 0);
    PyObject *wild = PyTuple_GET_ITEM(shape, 2);
    if (!PyBytes_CheckExact(fixed) || !PyBytes_CheckExact(wild)) return 0;
    if (PyBytes_GET_SIZE(fixed) % 4 || PyBytes_GET_SIZE(wild) % 4) return 0;
    Py_ssize_t nfixed = PyBytes_GET_SIZE(fixed) / 4, nwild = PyBytes_GET_SIZE(wild) / 4;
    if (nfixed + nwild != count) return 0;
    /* _Template.expected: None with no constant, the str with one, a tuple with more
     * (itemgetter's shapes); items 1 of the shape tuple is the same object. */
    PyObject *expected = PyTuple_GET_ITEM(shape, 1);
    if (nfixed == 0) {
        out->expected = NULL;
    } else if (nfixed == 1) {
        if (!PyUnicode_CheckExact(expected)) return 0;
        out->expected = &PyTuple_GET_ITEM(shape, 1);
    } else {
        if (!PyTuple_CheckExact(expected) || PyTuple_GET_SIZE(expected) != nfixed) return 0;
        out->expected = &PyTuple_GET_ITEM(expected, 0);
    }
    out->fixed = (const uint32_t *)PyBytes_AS_STRING(fixed);
    out->nfixed = nfixed;
    out->wild = (const uint32_t *)PyBytes_AS_STRING(wild);
    out->nwild = nwild;
    for (Py_ssize_t i = 0; i < nfixed; i++) {
        PyObject *e = out->expected[i];
        if (out->fixed[i] >= (uint32_t)count || !PyUnicode_CheckExact(e) || PyUnicode_READY(e) < 0)
            return 0;
    }
    for (Py_ssize_t i = 0; i < nwild; i++)
        if (out->wild[i] >= (uint32_t)count) return 0;
    return 1;
}

/* How many of the shape's constant tokens `tokens` has at their places. */
static Py_ssize_t count_same(const Shape *shape, PyObject *tokens) {
    Py_ssize_t same = 0;
    for (Py_ssize_t i = 0; i < shape->nfixed; i++)
        same += same_str(PyList_GET_ITEM(tokens, shape->fixed[i]), shape->expected[i]);
    return same;
}

/* The leaf's candidate list (borrowed via *holder, a new reference); NULL with an
 * exception, or without one when the walk ends without a leaf: *missing 1 when the tree
 * has no such path (a creation, _search's (None, False, 0)), 0 when a node is not of the
 * shape this file expects (Python decides). */
static PyObject *find_leaf(PyObject *root_children, PyObject *tokens, Py_ssize_t count,
                           PyObject *param, long max_node_depth, PyObject **holder,
                           int *missing) {
    *missing = 0;
    PyObject *key = count_key(count);
    if (key == NULL) return NULL;
    PyObject *node = PyDict_GetItemWithError(root_children, key);
    Py_DECREF(key);
    if (node == NULL) {
        *missing = !PyErr_Occurred();
        return NULL;
    }
    Py_INCREF(node);
    long depth = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (depth >= max_node_depth || depth == count) break;
        PyObject *children = PyObject_GetAttr(node, s_key_to_child_node);
        Py_DECREF(node);
        if (children == NULL) return NULL;
        if (!PyDict_CheckExact(children)) {
            Py_DECREF(children);
            return NULL;
        }
        PyObject *child = PyDict_GetItemWithError(children, PyList_GET_ITEM(tokens, i));
        if (child == NULL && !PyErr_Occurred()) child = PyDict_GetItemWithError(children, param);
        Py_XINCREF(child);
        Py_DECREF(children);
        if (child == NULL) {
            *missing = !PyErr_Occurred();
            return NULL;
        }
        node = child;
        depth++;
    }
    PyObject *ids = PyObject_GetAttr(node, s_cluster_ids);
    Py_DECREF(node);
    if (ids == NULL) return NULL;
    if (!PyList_CheckExact(ids)) {
        Py_DECREF(ids);
        return NULL;
    }
    *holder = ids;
    return ids;
}

typedef struct {
    PyObject *templates;
    double sim_th;
} Search;

/* The best template for `tokens` among `candidates` as _search picks it: 1 with *best
 * (new reference), its drain id (borrowed from the list, kept alive by the caller's
 * hold on it), its shape's holder and whether it is exact; 0 when there is none;
 * -1 with an exception; 2 when a candidate's shape is unusual (Python decides). */
static int pick_best(const Search *s, PyObject *candidates, PyObject *tokens, Py_ssize_t count,
                     PyObject **best, PyObject **best_id, Shape *best_shape,
                     PyObject **best_holder, int *exact) {
    double max_sim = -1.0;
    Py_ssize_t max_params = -1, best_same = 0;
    *best = NULL;
    *best_holder = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(candidates); i++) {
        PyObject *drain_id = PyList_GET_ITEM(candidates, i);
        PyObject *template = PyDict_GetItemWithError(s->templates, drain_id);
        if (template == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue; /* a cluster the LRU evicted: our map mirrors Drain's */
        }
        Py_INCREF(template);
        Shape shape;
        PyObject *holder = NULL;
        int ok = read_shape(template, count, &shape, &holder);
        if (ok <= 0) {
            Py_XDECREF(holder);
            Py_DECREF(template);
            if (ok < 0) goto fail;
            Py_XDECREF(*best);
            Py_XDECREF(*best_holder);
            *best = *best_holder = NULL;
            return 2;
        }
        Py_ssize_t same = count_same(&shape, tokens);
        double sim = (double)same / (double)count;
        if (sim > max_sim || (sim == max_sim && shape.nwild > max_params)) {
            max_sim = sim;
            max_params = shape.nwild;
            best_same = same;
            Py_XDECREF(*best);
            Py_XDECREF(*best_holder);
            *best = template;
            *best_holder = holder;
            *best_id = drain_id;
            *best_shape = shape;
        } else {
            Py_DECREF(holder);
            Py_DECREF(template);
        }
    }
    if (*best == NULL || max_sim < s->sim_th) {
        Py_XDECREF(*best);
        Py_XDECREF(*best_holder);
        *best = *best_holder = NULL;
        return 0;
    }
    *exact = best_same == best_shape->nfixed;
    return 1;
fail:
    Py_XDECREF(*best);
    Py_XDECREF(*best_holder);
    *best = *best_holder = NULL;
    return -1;
}

/* cluster.size += 1, the LRU touch, touched, the move to the recent end, then the
 * three columns: _mine's steps for an exact match. 0 or -1 with an exception. */
static int record_match(PyObject *template, PyObject *drain_id, const Shape *shape,
                        PyObject *tokens, PyObject *templates, int bounded, PyObject *touch,
                        long long tick, PyObject *ids, PyObject *params, PyObject *versions) {
    PyObject *cluster = PyObject_GetAttr(template, s_cluster);
    if (cluster == NULL) return -1;
    PyObject *size = PyObject_GetAttr(cluster, s_size);
    if (size == NULL) {
        Py_DECREF(cluster);
        return -1;
    }
    PyObject *one = PyLong_FromLong(1);
    PyObject *bigger = one == NULL ? NULL : PyNumber_Add(size, one);
    Py_XDECREF(one);
    Py_DECREF(size);
    int rc = bigger == NULL ? -1 : PyObject_SetAttr(cluster, s_size, bigger);
    Py_XDECREF(bigger);
    Py_DECREF(cluster);
    if (rc < 0) return -1;
    if (bounded) {
        if (touch != Py_None) {
            PyObject *r = PyObject_CallOneArg(touch, drain_id);
            if (r == NULL) return -1;
            Py_DECREF(r);
        }
        PyObject *stamp = PyLong_FromLongLong(tick);
        if (stamp == NULL) return -1;
        rc = PyObject_SetAttr(template, s_touched, stamp);
        Py_DECREF(stamp);
        if (rc < 0) return -1;
        Py_INCREF(drain_id); /* the list holds it, but the dict's delete may drop a ref */
        rc = PyDict_DelItem(templates, drain_id);
        if (rc == 0) rc = PyDict_SetItem(templates, drain_id, template);
        Py_DECREF(drain_id);
        if (rc < 0) return -1;
    }
    PyObject *tid = PyObject_GetAttr(template, s_template_id);
    if (tid == NULL) return -1;
    rc = PyList_Append(ids, tid);
    Py_DECREF(tid);
    if (rc < 0) return -1;
    PyObject *picked = PyTuple_New(shape->nwild);
    if (picked == NULL) return -1;
    for (Py_ssize_t i = 0; i < shape->nwild; i++) {
        PyObject *token = PyList_GET_ITEM(tokens, shape->wild[i]);
        Py_INCREF(token);
        PyTuple_SET_ITEM(picked, i, token);
    }
    rc = PyList_Append(params, picked);
    Py_DECREF(picked);
    if (rc < 0) return -1;
    PyObject *version = PyObject_GetAttr(template, s_version);
    if (version == NULL) return -1;
    rc = PyList_Append(versions, version);
    Py_DECREF(version);
    return rc;
}

static PyObject *mine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "mine() takes 15 arguments");
        return NULL;
    }
    PyObject *root_children = args[0], *templates = args[1], *param = args[2];
    long max_node_depth = PyLong_AsLong(args[3]);
    double sim_th = PyFloat_AsDouble(args[4]);
    Py_ssize_t max_chars = PyLong_AsSsize_t(args[5]);
    Py_ssize_t max_tokens = PyLong_AsSsize_t(args[6]);
    int bounded = PyObject_IsTrue(args[7]);
    PyObject *touch = args[8], *bodies = args[9], *ids = args[10], *params = args[11];
    PyObject *versions = args[12];
    Py_ssize_t start = PyLong_AsSsize_t(args[13]);
    long long tick = PyLong_AsLongLong(args[14]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(bodies) || !PyDict_CheckExact(root_children) ||
        !PyDict_CheckExact(templates) || !PyUnicode_CheckExact(param) ||
        !PyList_CheckExact(ids) || !PyList_CheckExact(params) || !PyList_CheckExact(versions)) {
        PyErr_SetString(PyExc_TypeError, "mine(): an argument is not of the expected type");
        return NULL;
    }
    Search search = {templates, sim_th};
    long long work = 0;
    /* the search of the body it stopped at, when Python may take it (the header) */
    int stop_found = -1;
    PyObject *stop_id = Py_None;
    Py_ssize_t stop_compared = 0;
    Py_ssize_t index = start < 0 ? 0 : start;
    for (; index < PyList_GET_SIZE(bodies); index++) {
        PyObject *body = PyList_GET_ITEM(bodies, index);
        if (!PyUnicode_CheckExact(body)) break;
        if (max_chars >= 0 && PyUnicode_GET_LENGTH(body) > max_chars) break;
        PyObject *tokens = PyUnicode_Split(body, NULL, -1);
        if (tokens == NULL) return NULL;
        Py_ssize_t count = PyList_GET_SIZE(tokens);
        if (count == 0 || (max_tokens >= 0 && count > max_tokens)) {
            Py_DECREF(tokens);
            break;
        }
        PyObject *holder = NULL;
        int missing = 0;
        PyObject *candidates =
            find_leaf(root_children, tokens, count, param, max_node_depth, &holder, &missing);
        if (candidates == NULL) {
            Py_DECREF(tokens);
            if (PyErr_Occurred()) return NULL;
            if (missing) stop_found = 0; /* no leaf: a creation, nothing compared */
            break;
        }
        PyObject *best = NULL, *best_id = NULL, *shape_holder = NULL;
        Shape shape = {NULL, 0, NULL, NULL, 0};
        int exact = 0;
        int found = pick_best(&search, candidates, tokens, count, &best, &best_id, &shape,
                              &shape_holder, &exact);
        if (found == 1 && exact) {
            tick += 1;
            work += 1 + PyList_GET_SIZE(candidates);
            int rc = record_match(best, best_id, &shape, tokens, templates, bounded, touch, tick,
                                  ids, params, versions);
            Py_DECREF(best);
            Py_DECREF(shape_holder);
            Py_DECREF(holder);
            Py_DECREF(tokens);
            if (rc < 0) return NULL;
            continue;
        }
        if (found == 0 || found == 1) {
            /* none (a creation) or a widening of best: Python's, with this answer */
            stop_found = found;
            stop_compared = PyList_GET_SIZE(candidates);
            if (found == 1) stop_id = best_id; /* borrowed from candidates: built below */
        }
        PyObject *out = NULL;
        if (found >= 0)
            out = Py_BuildValue("(nLLiOn)", index, tick, work, stop_found, stop_id, stop_compared);
        Py_XDECREF(best);
        Py_XDECREF(shape_holder);
        Py_DECREF(holder);
        Py_DECREF(tokens);
        return out; /* NULL when found < 0: the exception stands */
    }
    return Py_BuildValue("(nLLiOn)", index, tick, work, stop_found, stop_id, stop_compared);
}

/* oldest(ids, templates) -> the id in `ids` whose template (templates[id]) has the
 * smallest `touched`, the first of equals: TenantMiner._create's
 * min(map(templates.__getitem__, ids), key=last_use) for a full leaf, which compares a
 * whole leaf of templates per creation. KeyError for an id with no template, ValueError
 * for no ids, as min() and [] raise them. */
static PyObject *oldest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "oldest(ids: list, templates: dict)");
        return NULL;
    }
    PyObject *ids = args[0], *templates = args[1];
    PyObject *best_id = NULL, *best_touched = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ids); i++) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        PyObject *template = PyDict_GetItemWithError(templates, id);
        if (template == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, id);
            goto fail;
        }
        PyObject *touched = PyObject_GetAttr(template, s_touched);
        if (touched == NULL) goto fail;
        int less = best_touched == NULL ? 1 : PyObject_RichCompareBool(touched, best_touched, Py_LT);
        if (less < 0) {
            Py_DECREF(touched);
            goto fail;
        }
        if (less) {
            Py_XDECREF(best_touched);
            best_touched = touched;
            best_id = id;
        } else {
            Py_DECREF(touched);
        }
    }
    if (best_touched == NULL) {
        PyErr_SetString(PyExc_ValueError, "oldest() of no ids");
        return NULL;
    }
    Py_DECREF(best_touched);
    Py_INCREF(best_id);
    return best_id;
fail:
    Py_XDECREF(best_touched);
    return NULL;
}

static PyMethodDef methods[] = {
    {"mine", (PyCFunction)(void (*)(void))mine, METH_FASTCALL,
     "Mine bodies[start:] while each matches a template exactly; "
     "(index, tick, work, found, best_id, compared)."},
    {"oldest", (PyCFunction)(void (*)(void))oldest, METH_FASTCALL,
     "The id of ids whose template has the smallest touched (the first of equals)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_minefast", "TenantMiner._mine's exact-match fast path.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__minefast(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_key_to_child_node, "key_to_child_node"}, {&s_cluster_ids, "cluster_ids"},
        {&s_cluster, "cluster"}, {&s_size, "size"}, {&s_shape, "shape"},
        {&s_template_id, "template_id"}, {&s_version, "version"}, {&s_touched, "touched"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
