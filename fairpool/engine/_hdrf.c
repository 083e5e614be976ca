/* The float backend of the fair-share update, compiled: fairpool/engine/piecewise.py and the
 * function / distribution steps of fairpool/engine/fairshare.py (_Update._functions and
 * _Update.distribute), line for line in doubles, with the same epsilons and the same order of
 * floating-point operations, so that it gives the pure-Python float backend's numbers. The
 * Python code is the specification (and the exact backend); comments here only say where C
 * has to do something differently.
 *
 * update(size, kinds, child_start, child_count, children, weights, usage, demand, limits,
 *        guarantees, dens)
 * takes the tree flattened with every parent before its children (element 0 the root; element
 * e's children, in the update's order, are children[child_start[e] : + child_count[e]]):
 * buffers of one item per element, then lists of one tuple per element (usage and demand as
 * numerators over dens) and returns every element's fair share, size doubles per element, as
 * bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OPERATION = 0, FAIR_SHARE = 1, FIFO = 2 };

/* A piecewise-linear function: n points, ys row-major (n * size). */
typedef struct {
    Py_ssize_t n, cap;
    double *xs, *ys;
} Fn;

/* Fitted: max fit factor (ms) and fair share (ys) by suggestion (xs), in one block (xs). */
typedef struct {
    Py_ssize_t n;
    double *xs, *ms, *ys;
} Fitted;

/* Function.sum's breakpoint events: a slope change or a jump at x. */
typedef struct {
    double x;
    int jump;
    double *delta;
} Event;

/* Scratch space reused from element to element (a malloc per element would cost more than
 * most elements' arithmetic). */
typedef struct {
    Py_ssize_t size;
    double *vectors; /* 8 * size: the first half for the functions, the second for fit */
    Event *events;
    double *deltas;
    Py_ssize_t *cursor, *stop, *heap;
    Py_ssize_t event_cap, delta_cap, cursor_cap, stop_cap, heap_cap;
} Ctx;

/* Grows *buffer to hold n items of itemsize (amortised doubling). */
static int grow(void **buffer, Py_ssize_t *cap, Py_ssize_t n, size_t itemsize) {
    if (n <= *cap) return 1;
    Py_ssize_t want = *cap ? *cap : 64;
    while (want < n) want *= 2;
    void *grown = realloc(*buffer, (size_t)want * itemsize);
    if (!grown) {
        return 0;
    }
    *buffer = grown;
    *cap = want;
    return 1;
}

static int fn_reserve(Ctx *c, Fn *f, Py_ssize_t n) {
    if (n <= f->cap) return 1;
    Py_ssize_t cap = f->cap ? f->cap : 8;
    while (cap < n) cap *= 2;
    double *xs = realloc(f->xs, (size_t)cap * sizeof(double));
    if (xs) f->xs = xs;
    double *ys = realloc(f->ys, (size_t)cap * (size_t)c->size * sizeof(double));
    if (ys) f->ys = ys;
    if (!xs || !ys) {
        return 0;
    }
    f->cap = cap;
    return 1;
}

static void fn_free(Fn *f) {
    free(f->xs);
    free(f->ys);
    f->xs = f->ys = NULL;
    f->n = f->cap = 0;
}

static int fn_push(Ctx *c, Fn *f, double x, const double *y) {
    if (!fn_reserve(c, f, f->n + 1)) return 0;
    f->xs[f->n] = x;
    memcpy(f->ys + f->n * c->size, y, (size_t)c->size * sizeof(double));
    f->n++;
    return 1;
}

static int equal(const double *a, const double *b, Py_ssize_t size) {
    for (Py_ssize_t r = 0; r < size; r++)
        if (a[r] != b[r]) return 0;
    return 1;
}

static int any(const double *a, Py_ssize_t size) {
    for (Py_ssize_t r = 0; r < size; r++)
        if (a[r] != 0.0) return 1;
    return 0;
}

static void lerp(const double *y0, const double *y1, double t, double *out, Py_ssize_t size) {
    for (Py_ssize_t r = 0; r < size; r++) out[r] = y0[r] + (y1[r] - y0[r]) * t;
}

static int double_order(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

/* piecewise._straight, float branch. */
static int straight(double x0, double x1, double x2, const double *y0, const double *y1,
                    const double *y2, Py_ssize_t size) {
    if (!(x0 < x1 && x1 < x2)) return 0;
    double a = x2 - x1, b = x1 - x0;
    for (Py_ssize_t r = 0; r < size; r++) {
        double left = (y1[r] - y0[r]) * a, right = (y2[r] - y1[r]) * b;
        if (fabs(left - right) > 1e-12 * (fabs(left) + fabs(right)) + 1e-300) return 0;
    }
    return 1;
}

/* piecewise._simplified, in place: a kept point never overtakes the one being read. */
static void simplify(Ctx *c, Fn *f) {
    Py_ssize_t size = c->size, n = f->n, k = 1;
    double *xs = f->xs, *ys = f->ys;
    for (Py_ssize_t i = 1; i < n - 1; i++) {
        if (xs[i] == xs[k - 1] && equal(ys + i * size, ys + (k - 1) * size, size)) continue;
        if (!straight(xs[k - 1], xs[i], xs[i + 1], ys + (k - 1) * size, ys + i * size,
                      ys + (i + 1) * size, size)) {
            xs[k] = xs[i];
            memmove(ys + k * size, ys + i * size, (size_t)size * sizeof(double));
            k++;
        }
    }
    if (n > 1 && !(xs[n - 1] == xs[k - 1] && equal(ys + (n - 1) * size, ys + (k - 1) * size, size))) {
        xs[k] = xs[n - 1];
        memmove(ys + k * size, ys + (n - 1) * size, (size_t)size * sizeof(double));
        k++;
    }
    if (k == 1) { /* n >= 2 always, so there is room */
        xs[1] = xs[0];
        memcpy(ys + size, ys, (size_t)size * sizeof(double));
        k = 2;
    }
    f->n = k;
}

/* Fitted.by_suggestion, stretched (Function.stretched) by factor onto [0, 1]. */
static int stretched_suggestion(Ctx *c, const Fitted *g, double factor, Fn *out) {
    Py_ssize_t size = c->size;
    out->n = 0;
    if (!fn_reserve(c, out, g->n + 1)) return 0;
    memcpy(out->ys, g->ys, (size_t)(g->n * size) * sizeof(double));
    memcpy(out->xs, g->xs, (size_t)g->n * sizeof(double));
    out->n = g->n;
    simplify(c, out);
    if (factor != 1.0)
        for (Py_ssize_t i = 0; i < out->n; i++) out->xs[i] /= factor;
    if (out->xs[out->n - 1] < 1.0) return fn_push(c, out, 1.0, out->ys + (out->n - 1) * size);
    return 1;
}

/* Whether part a's next event comes before part b's: by x, then by part, which is the order
 * the Python sweep accumulates them in (its dicts sum contributions in insertion order). */
static int before(const Ctx *c, Py_ssize_t a, Py_ssize_t b) {
    double xa = c->events[c->cursor[a]].x, xb = c->events[c->cursor[b]].x;
    return xa < xb || (xa == xb && a < b);
}

static void sift_down(Ctx *c, Py_ssize_t count) {
    Py_ssize_t *heap = c->heap, i = 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= count) return;
        if (child + 1 < count && before(c, heap[child + 1], heap[child])) child++;
        if (!before(c, heap[child], heap[i])) return;
        Py_ssize_t swap = heap[i];
        heap[i] = heap[child], heap[child] = swap;
        i = child;
    }
}

/* Function.sum over parts (at least two, common domain). Each part's events come out of its
 * points already ordered by x, so a heap merges them instead of sorting them all. */
static int sum(Ctx *c, Fn *parts, Py_ssize_t count, Fn *out) {
    Py_ssize_t size = c->size, segments = 0;
    for (Py_ssize_t p = 0; p < count; p++) segments += parts[p].n - 1;
    if (!grow((void **)&c->events, &c->event_cap, 2 * segments, sizeof(Event)) ||
        !grow((void **)&c->deltas, &c->delta_cap, 2 * segments, (size_t)size * sizeof(double)) ||
        !grow((void **)&c->cursor, &c->cursor_cap, count, sizeof(Py_ssize_t)) ||
        !grow((void **)&c->stop, &c->stop_cap, count, sizeof(Py_ssize_t)) ||
        !grow((void **)&c->heap, &c->heap_cap, count, sizeof(Py_ssize_t)))
        return 0;
    Event *events = c->events;
    double *value = c->vectors, *slope_now = value + size, *jump = value + 2 * size;
    double *change = value + 3 * size;
    Py_ssize_t e = 0, heaped = 0;
    double start = parts[0].xs[0], last = parts[0].xs[parts[0].n - 1];
    for (Py_ssize_t r = 0; r < size; r++) value[r] = slope_now[r] = 0.0;
    for (Py_ssize_t p = 0; p < count; p++) {
        const double *xs = parts[p].xs, *ys = parts[p].ys;
        c->cursor[p] = e;
        for (Py_ssize_t r = 0; r < size; r++) value[r] += ys[r];
        for (Py_ssize_t i = 0; i + 1 < parts[p].n; i++) {
            double x0 = xs[i], x1 = xs[i + 1], width = x1 - x0;
            const double *y0 = ys + i * size, *y1 = ys + (i + 1) * size;
            double *d = c->deltas + e * size;
            /* A rounding residue of a jump stays a jump. */
            if (x0 == x1 || width <= 1e-13 * (1.0 + fabs(x0))) {
                for (Py_ssize_t r = 0; r < size; r++) d[r] = y1[r] - y0[r];
                events[e++] = (Event){x0, 1, d};
                continue;
            }
            for (Py_ssize_t r = 0; r < size; r++) d[r] = (y1[r] - y0[r]) / width;
            if (!any(d, size)) continue;
            events[e++] = (Event){x0, 0, d};
            double *back = c->deltas + e * size;
            for (Py_ssize_t r = 0; r < size; r++) back[r] = -d[r];
            events[e++] = (Event){x1, 0, back};
        }
        c->stop[p] = e;
        if (e > c->cursor[p]) {
            if (events[e - 1].x > last) last = events[e - 1].x;
            /* Sift up. */
            Py_ssize_t i = heaped++;
            c->heap[i] = p;
            while (i > 0 && before(c, c->heap[i], c->heap[(i - 1) / 2])) {
                Py_ssize_t parent = (i - 1) / 2, swap = c->heap[i];
                c->heap[i] = c->heap[parent], c->heap[parent] = swap;
                i = parent;
            }
        }
    }
    /* The breakpoints: every event's x, and both ends of the domain. */
    double ends[2] = {start, parts[0].xs[parts[0].n - 1]};
    Py_ssize_t pending = 0;
    double previous = heaped && events[c->cursor[c->heap[0]]].x < start
                          ? events[c->cursor[c->heap[0]]].x
                          : start;
    out->n = 0;
    while (heaped || pending < 2) {
        double x = heaped ? events[c->cursor[c->heap[0]]].x : INFINITY;
        if (pending < 2 && ends[pending] < x) x = ends[pending];
        while (pending < 2 && ends[pending] == x) pending++;
        double step = x - previous;
        if (step != 0.0)
            for (Py_ssize_t r = 0; r < size; r++)
                if (slope_now[r] != 0.0) value[r] += slope_now[r] * step;
        if (!fn_push(c, out, x, value)) return 0;
        int jumped = 0, changed = 0;
        for (Py_ssize_t r = 0; r < size; r++) jump[r] = change[r] = 0.0;
        while (heaped && events[c->cursor[c->heap[0]]].x == x) {
            Py_ssize_t p = c->heap[0];
            for (; c->cursor[p] < c->stop[p] && events[c->cursor[p]].x == x; c->cursor[p]++) {
                const Event *event = &events[c->cursor[p]];
                double *into = event->jump ? jump : change;
                for (Py_ssize_t r = 0; r < size; r++) into[r] += event->delta[r];
                if (event->jump)
                    jumped = 1;
                else
                    changed = 1;
            }
            if (c->cursor[p] == c->stop[p]) c->heap[0] = c->heap[--heaped];
            sift_down(c, heaped);
        }
        if (jumped && x != last) {
            for (Py_ssize_t r = 0; r < size; r++) value[r] += jump[r];
            if (!fn_push(c, out, x, value)) return 0;
        }
        if (changed)
            for (Py_ssize_t r = 0; r < size; r++) slope_now[r] += change[r];
        previous = x;
    }
    simplify(c, out);
    return 1;
}

/* Function.concatenation: piece k on [k, k + 1], on top of the earlier pieces' end values. */
static int concatenation(Ctx *c, Fn *pieces, Py_ssize_t count, Fn *out) {
    Py_ssize_t size = c->size;
    double *moved = c->vectors, *base = moved + size;
    for (Py_ssize_t r = 0; r < size; r++) base[r] = 0.0;
    out->n = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Fn *piece = &pieces[k];
        double dx = (double)k - piece->xs[0];
        for (Py_ssize_t i = 0; i < piece->n; i++) {
            for (Py_ssize_t r = 0; r < size; r++) moved[r] = piece->ys[i * size + r] + base[r];
            if (i == 0 && out->n && equal(moved, out->ys + (out->n - 1) * size, size)) continue;
            if (!fn_push(c, out, piece->xs[i] + dx, moved)) return 0;
        }
        memcpy(base, out->ys + (out->n - 1) * size, (size_t)size * sizeof(double));
    }
    simplify(c, out);
    return 1;
}

/* _Update._operation_by_fit_factor. */
static int operation_function(Ctx *c, const double *usage, const double *demand, Fn *out) {
    Py_ssize_t size = c->size;
    double peak = 0.0;
    for (Py_ssize_t r = 0; r < size; r++)
        if (r == 0 || usage[r] > peak) peak = usage[r];
    double *row = c->vectors, *knees = row + size;
    for (Py_ssize_t r = 0; r < size; r++) row[r] = 0.0;
    out->n = 0;
    int ok = fn_push(c, out, 0.0, row);
    if (peak != 0.0) {
        Py_ssize_t count = 0;
        for (Py_ssize_t r = 0; r < size; r++)
            if (usage[r] != 0.0) knees[count++] = usage[r] / peak;
        qsort(knees, (size_t)count, sizeof(double), double_order);
        for (Py_ssize_t k = 0; k < count && ok; k++) {
            if (k && knees[k] == knees[k - 1]) continue;
            for (Py_ssize_t r = 0; r < size; r++) {
                double bound = knees[k] * peak;
                row[r] = usage[r] < bound ? usage[r] : bound;
            }
            ok = fn_push(c, out, knees[k], row);
        }
    } else {
        ok = ok && fn_push(c, out, 1.0, usage);
    }
    return ok && fn_push(c, out, 2.0, demand);
}

/* A walk point of piecewise.fit: (sigma, fit factor, fair share). */
typedef struct {
    Py_ssize_t n, cap;
    double *sigma, *x, *y;
} Walk;

static int walk_push(Ctx *c, Walk *w, double sigma, double x, const double *y) {
    if (w->n == w->cap) {
        Py_ssize_t cap = w->cap ? 2 * w->cap : 16;
        double *s = realloc(w->sigma, (size_t)cap * sizeof(double));
        if (s) w->sigma = s;
        double *xs = realloc(w->x, (size_t)cap * sizeof(double));
        if (xs) w->x = xs;
        double *ys = realloc(w->y, (size_t)cap * (size_t)c->size * sizeof(double));
        if (ys) w->y = ys;
        if (!s || !xs || !ys) {
                return 0;
        }
        w->cap = cap;
    }
    w->sigma[w->n] = sigma;
    w->x[w->n] = x;
    memcpy(w->y + w->n * c->size, y, (size_t)c->size * sizeof(double));
    w->n++;
    return 1;
}

static double top_over(const double *y, const double *g, Py_ssize_t size) {
    double top = y[0] - g[0];
    for (Py_ssize_t r = 1; r < size; r++)
        if (y[r] - g[r] > top) top = y[r] - g[r];
    return top;
}

/* piecewise._clip, writing the Fitted. ss / ms / vs: the transposed walk. */
static int clip(Ctx *c, const Walk *t, Fitted *out) {
    Py_ssize_t size = c->size, n = t->n;
    const double *ss = t->sigma, *ms = t->x, *vs = t->y;
    out->xs = malloc((size_t)(n + 3) * (size_t)(2 + size) * sizeof(double));
    if (!out->xs) {
        return 0;
    }
    out->ms = out->xs + n + 3;
    out->ys = out->ms + n + 3;
    Py_ssize_t k = 0, j = 0;
    while (j < n && ss[j] <= 0.0) j++; /* bisect_right(ss, 0) */
    j = j - 1 > 0 ? j - 1 : 0;
#define OUT(s_, m_) (out->xs[k] = (s_), out->ms[k] = (m_), out->ys + (k++) * size)
    if (j + 1 < n && ss[j] < 0.0 && 0.0 < ss[j + 1]) {
        double u = (0.0 - ss[j]) / (ss[j + 1] - ss[j]);
        double *v = OUT(0.0, ms[j] + (ms[j + 1] - ms[j]) * u);
        lerp(vs + j * size, vs + (j + 1) * size, u, v, size);
    } else {
        double m0 = ms[j];
        Py_ssize_t first = j;
        while (first > 0 && ms[first - 1] == m0) first--;
        memcpy(OUT(0.0, m0), vs + first * size, (size_t)size * sizeof(double));
        if (!equal(vs + j * size, vs + first * size, size))
            memcpy(OUT(0.0, m0), vs + j * size, (size_t)size * sizeof(double));
    }
    for (Py_ssize_t i = j + 1; i < n; i++) {
        double s = ss[i];
        if (s <= 0.0) continue;
        if (s <= 1.0) {
            memcpy(OUT(s, ms[i]), vs + i * size, (size_t)size * sizeof(double));
            if (s < 1.0) continue;
        } else {
            double s0 = out->xs[k - 1], m0 = out->ms[k - 1];
            double u = (1.0 - s0) / (s - s0);
            const double *v0 = out->ys + (k - 1) * size;
            double *v = OUT(1.0, m0 + (ms[i] - m0) * u);
            lerp(v0, vs + i * size, u, v, size);
        }
        break;
    }
    if (out->xs[k - 1] < 1.0) {
        double *v = OUT(1.0, out->ms[k - 1]);
        memcpy(v, v - size, (size_t)size * sizeof(double));
    }
#undef OUT
    out->n = k;
    return 1;
}

/* piecewise.fit, float branch (with _settled). w and t are scratch walks. */
static int fit(Ctx *c, const Fn *f, const double *guarantee, const double *limits, Walk *w,
               Walk *t, Fitted *out) {
    Py_ssize_t size = c->size, n = f->n;
    double *scratch = c->vectors + 4 * size;
    double *ceilings = scratch, *cs = scratch + size, *ms = scratch + 2 * size;
    double *cut = scratch + 3 * size;
    for (Py_ssize_t r = 0; r < size; r++)
        ceilings[r] = limits[r] + 1e-12 * (1.0 + fabs(limits[r]));
    w->n = 0;
    double px = f->xs[0];
    const double *py = f->ys;
    double sigma_prev = top_over(py, guarantee, size);
    int ok = walk_push(c, w, sigma_prev, px, py);
    for (Py_ssize_t index = 1; index < n && ok; index++) {
        double x = f->xs[index];
        const double *y = f->ys + index * size;
        int over = 0;
        for (Py_ssize_t r = 0; r < size; r++)
            if (y[r] > ceilings[r]) over = 1;
        if (x == px) {
            if (over) break;
            double sigma = top_over(y, guarantee, size);
            if (sigma < sigma_prev) sigma = sigma_prev; /* float rounding only */
            ok = walk_push(c, w, sigma, x, y);
            px = x, py = y, sigma_prev = sigma;
            continue;
        }
        double end = 1.0;
        if (over) {
            int first = 1;
            for (Py_ssize_t r = 0; r < size; r++)
                if (y[r] > ceilings[r]) {
                    double e = (limits[r] - py[r]) / (y[r] - py[r]);
                    if (first || e < end) end = e;
                    first = 0;
                }
        }
        /* The upper envelope of the lines c_r + t * m_r, t in [0, end]. */
        Py_ssize_t current = 0;
        for (Py_ssize_t r = 0; r < size; r++) {
            cs[r] = py[r] - guarantee[r];
            ms[r] = y[r] - py[r];
            if (r && (cs[r] > cs[current] || (cs[r] == cs[current] && ms[r] > ms[current])))
                current = r;
        }
        double top = cs[0] + ms[0] * end;
        for (Py_ssize_t r = 1; r < size; r++)
            if (cs[r] + ms[r] * end > top) top = cs[r] + ms[r] * end;
        if (cs[current] + ms[current] * end < top) {
            double at = 0.0;
            while (ok) {
                Py_ssize_t best = -1;
                double best_t = end;
                for (Py_ssize_t q = 0; q < size; q++) {
                    if (ms[q] > ms[current]) {
                        double crossing = (cs[current] - cs[q]) / (ms[q] - ms[current]);
                        if ((at < crossing && crossing < best_t) ||
                            (best >= 0 && crossing == best_t && ms[q] > ms[best]))
                            best = q, best_t = crossing;
                    }
                }
                if (best < 0) break;
                at = best_t, current = best;
                double sigma = cs[current] + ms[current] * at;
                if (sigma < sigma_prev) sigma = sigma_prev;
                lerp(py, y, at, cut, size);
                ok = walk_push(c, w, sigma, px + (x - px) * at, cut);
                sigma_prev = sigma;
            }
        }
        if (over) {
            if (end > 0.0 && ok) {
                lerp(py, y, end, cut, size);
                double sigma = top_over(cut, guarantee, size);
                if (sigma_prev >= sigma) sigma = sigma_prev;
                ok = walk_push(c, w, sigma, px + (x - px) * end, cut);
            }
            break;
        }
        double sigma = top_over(y, guarantee, size);
        if (sigma_prev >= sigma) sigma = sigma_prev;
        ok = ok && walk_push(c, w, sigma, x, y);
        px = x, py = y, sigma_prev = sigma;
    }
    if (!ok) return 0;
    /* _settled */
    double anchor = 0.0;
    for (Py_ssize_t i = 0; i < w->n; i++) {
        double sigma = w->sigma[i];
        if (fabs(sigma) <= 1e-12)
            sigma = 0.0;
        else if (fabs(sigma - 1.0) <= 1e-12)
            sigma = 1.0;
        if (i && sigma - anchor <= 1e-12 * (1.0 + fabs(anchor)))
            sigma = anchor;
        else
            anchor = sigma;
        w->sigma[i] = sigma;
    }
    while (w->n > 1 && w->x[w->n - 1] == w->x[w->n - 2]) w->n--;
    t->n = 0;
    for (Py_ssize_t i = 0; i < w->n && ok; i++) {
        const double *y = w->y + i * size;
        if (i && w->x[i] == w->x[i - 1] && w->sigma[i] > w->sigma[i - 1])
            ok = walk_push(c, t, w->sigma[i], w->x[i - 1], w->y + (i - 1) * size);
        ok = ok && walk_push(c, t, w->sigma[i], w->x[i], y);
    }
    return ok && clip(c, t, out);
}

/* Fitted.at: (max fit factor, fair share) at suggestion s; at a jump, the left limit. */
static double fitted_at(const Fitted *g, double s, double *share, Py_ssize_t size) {
    Py_ssize_t lo = 0, hi = g->n;
    while (lo < hi) { /* bisect_left */
        Py_ssize_t mid = (lo + hi) / 2;
        if (g->xs[mid] < s)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == g->n) {
        memcpy(share, g->ys + (g->n - 1) * size, (size_t)size * sizeof(double));
        return g->ms[g->n - 1];
    }
    if (g->xs[lo] == s || lo == 0) {
        memcpy(share, g->ys + lo * size, (size_t)size * sizeof(double));
        return g->ms[lo];
    }
    double x0 = g->xs[lo - 1], x1 = g->xs[lo], u = (s - x0) / (x1 - x0);
    lerp(g->ys + (lo - 1) * size, g->ys + lo * size, u, share, size);
    return g->ms[lo - 1] + (g->ms[lo] - g->ms[lo - 1]) * u;
}

typedef struct {
    Py_ssize_t size, count;
    const uint8_t *kinds;
    const int *child_start, *child_count, *children;
    const double *weights, *usage, *demand, *limits, *guarantees;
    Fitted *fitted;
    double *fair_share;
} Tree;

/* The smallest weight of e's children. */
static double lightest(const Tree *tree, Py_ssize_t e) {
    const int *children = tree->children + tree->child_start[e];
    double lightest = 0.0;
    for (Py_ssize_t k = 0; k < tree->child_count[e]; k++)
        if (k == 0 || tree->weights[children[k]] < lightest) lightest = tree->weights[children[k]];
    return lightest;
}

/* _Update._functions for one element whose children are fitted. */
static int element_function(Ctx *c, Tree *tree, Py_ssize_t e, Fn *parts, Fn *f) {
    Py_ssize_t size = c->size, count = tree->child_count[e];
    const int *children = tree->children + tree->child_start[e];
    if (tree->kinds[e] == OPERATION)
        return operation_function(c, tree->usage + e * size, tree->demand + e * size, f);
    Py_ssize_t used = 0;
    double least = lightest(tree, e);
    for (Py_ssize_t k = 0; k < count; k++) {
        const Fitted *g = &tree->fitted[children[k]];
        int fifo = tree->kinds[e] == FIFO;
        if (!fifo && !any(g->ys + (g->n - 1) * size, size)) continue;
        double factor = fifo ? 1.0 : tree->weights[children[k]] / least;
        /* FIFO: by_suggestion itself, which a factor of 1 leaves as it is on [0, 1]. */
        if (!stretched_suggestion(c, g, factor, &parts[used])) return 0;
        used++;
    }
    if (used == 0) {
        double *zeros = c->vectors;
        for (Py_ssize_t r = 0; r < size; r++) zeros[r] = 0.0;
        f->n = 0;
        return fn_push(c, f, 0.0, zeros) && fn_push(c, f, 1.0, zeros);
    }
    if (tree->kinds[e] == FIFO) return concatenation(c, parts, used, f);
    if (used == 1) {
        f->n = 0;
        if (!fn_reserve(c, f, parts[0].n)) return 0;
        memcpy(f->xs, parts[0].xs, (size_t)parts[0].n * sizeof(double));
        memcpy(f->ys, parts[0].ys, (size_t)(parts[0].n * size) * sizeof(double));
        f->n = parts[0].n;
        return 1;
    }
    return sum(c, parts, used, f);
}

/* _Update._bounds: guarantee and limits clamped into the function's range. */
static void bounds(Ctx *c, Tree *tree, Py_ssize_t e, const Fn *f, double *guarantee,
                   double *limits) {
    Py_ssize_t size = c->size, high = f->n - 1;
    while (high > 0 && f->xs[high - 1] == f->xs[f->n - 1]) high--; /* the left limit at end */
    const double *lo = f->ys, *hi = f->ys + high * size;
    for (Py_ssize_t r = 0; r < size; r++) {
        double lim = tree->limits[e * size + r];
        double g = e == 0 ? 1.0 : tree->guarantees[e * size + r]; /* the root: the tree */
        lim = lim >= lo[r] ? lim : lo[r];
        limits[r] = hi[r] < lim ? hi[r] : lim;
        g = g >= lo[r] ? g : lo[r];
        guarantee[r] = limits[r] < g ? limits[r] : g;
    }
}

static int run(Ctx *c, Tree *tree) {
    Py_ssize_t size = c->size, n = tree->count, widest = 1;
    for (Py_ssize_t e = 0; e < n; e++)
        if (tree->child_count[e] > widest) widest = tree->child_count[e];
    Fn *parts = calloc((size_t)widest, sizeof(Fn));
    double *scratch = malloc((size_t)(2 * size) * sizeof(double));
    c->vectors = malloc((size_t)(8 * size) * sizeof(double));
    Fn f = {0};
    Walk w = {0}, t = {0};
    int ok = parts && scratch && c->vectors;
    /* Bottom-up: children come after their parent. */
    for (Py_ssize_t e = n - 1; e >= 0 && ok; e--) {
        ok = element_function(c, tree, e, parts, &f);
        if (!ok) break;
        bounds(c, tree, e, &f, scratch, scratch + size);
        ok = fit(c, &f, scratch, scratch + size, &w, &t, &tree->fitted[e]);
    }
    /* Top-down: the root is suggested 1 (stored as the suggestion slot of its share). */
    double *suggestion = calloc((size_t)n, sizeof(double));
    ok = ok && suggestion;
    if (suggestion) suggestion[0] = 1.0;
    for (Py_ssize_t e = 0; e < n && ok; e++) {
        double factor = fitted_at(&tree->fitted[e], suggestion[e],
                                  tree->fair_share + e * size, size);
        Py_ssize_t count = tree->child_count[e];
        const int *children = tree->children + tree->child_start[e];
        double least = lightest(tree, e);
        for (Py_ssize_t k = 0; k < count; k++) {
            double s;
            if (tree->kinds[e] == FIFO) {
                s = factor - (double)k;
                s = s >= 0.0 ? s : 0.0;
                s = 1.0 < s ? 1.0 : s;
            } else {
                s = factor * (tree->weights[children[k]] / least);
                s = s < 1.0 ? s : 1.0;
            }
            suggestion[children[k]] = s;
        }
    }
    for (Py_ssize_t k = 0; k < widest && parts; k++) fn_free(&parts[k]);
    fn_free(&f);
    free(w.sigma), free(w.x), free(w.y), free(t.sigma), free(t.x), free(t.y);
    free(parts), free(scratch), free(suggestion), free(c->vectors);
    free(c->events), free(c->deltas), free(c->cursor), free(c->stop), free(c->heap);
    return ok;
}

static int view(PyObject *object, Py_buffer *buffer, Py_ssize_t items, Py_ssize_t itemsize,
                const char *name) {
    if (PyObject_GetBuffer(object, buffer, PyBUF_C_CONTIGUOUS) < 0) return 0;
    if (buffer->len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", name,
                     items * itemsize, buffer->len);
        PyBuffer_Release(buffer);
        return 0;
    }
    return 1;
}

/* Whether every child index is after its parent's and inside the tree. */
static int well_formed(const Tree *tree, Py_ssize_t children) {
    for (Py_ssize_t e = 0; e < tree->count; e++) {
        Py_ssize_t first = tree->child_start[e], count = tree->child_count[e];
        if (first < 0 || count < 0 || first + count > children) return 0;
        for (Py_ssize_t k = first; k < first + count; k++)
            if (tree->children[k] <= e || tree->children[k] >= tree->count) return 0;
    }
    return 1;
}

/* Reads rows (a list of count tuples of size numbers) into out, each number divided by the
 * matching item of dens unless dens is NULL; Python's own division, so that an int / int is
 * correctly rounded as in the Python backend. */
static int read_rows(PyObject *rows, Py_ssize_t count, Py_ssize_t size, PyObject *dens,
                     double *out, const char *name) {
    if (!PyList_Check(rows) || PyList_GET_SIZE(rows) != count) {
        PyErr_Format(PyExc_TypeError, "%s: expected a list of %zd tuples", name, count);
        return 0;
    }
    for (Py_ssize_t e = 0; e < count; e++) {
        PyObject *row = PyList_GET_ITEM(rows, e);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != size) {
            PyErr_Format(PyExc_TypeError, "%s: expected tuples of %zd numbers", name, size);
            return 0;
        }
        for (Py_ssize_t r = 0; r < size; r++) {
            PyObject *item = PyTuple_GET_ITEM(row, r);
            double value;
            if (dens) {
                PyObject *share = PyNumber_TrueDivide(item, PyTuple_GET_ITEM(dens, r));
                if (!share) return 0;
                value = PyFloat_AsDouble(share);
                Py_DECREF(share);
            } else {
                value = PyFloat_AsDouble(item);
            }
            if (value == -1.0 && PyErr_Occurred()) return 0;
            out[e * size + r] = value;
        }
    }
    return 1;
}

static PyObject *update(PyObject *module, PyObject *args) {
    (void)module;
    enum { ARRAYS = 5 };
    Py_ssize_t size;
    PyObject *objects[ARRAYS], *usage, *demand, *limits, *guarantees, *dens;
    if (!PyArg_ParseTuple(args, "nOOOOOOOOOO!", &size, &objects[0], &objects[1], &objects[2],
                          &objects[3], &objects[4], &usage, &demand, &limits, &guarantees,
                          &PyTuple_Type, &dens))
        return NULL;
    Py_buffer buffers[ARRAYS];
    if (PyObject_GetBuffer(objects[0], &buffers[0], PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t got = 1, n = buffers[0].len;
    static const char *names[] = {"kinds", "child_start", "child_count", "children", "weights"};
    const Py_ssize_t items[] = {n, n, n, n - 1, n};
    const Py_ssize_t itemsizes[] = {1, sizeof(int), sizeof(int), sizeof(int), sizeof(double)};
    PyObject *result = NULL;
    Tree tree = {0};
    Ctx c = {.size = size};
    double *vectors = NULL;
    int ok;
    if (n == 0 || size < 1 || PyTuple_GET_SIZE(dens) != size) {
        PyErr_SetString(PyExc_ValueError, "an empty tree, or dens not one per resource");
        goto done;
    }
    for (; got < ARRAYS; got++)
        if (!view(objects[got], &buffers[got], items[got], itemsizes[got], names[got])) goto done;
    vectors = malloc((size_t)(4 * n * size) * sizeof(double));
    if (!vectors) {
        PyErr_NoMemory();
        goto done;
    }
    tree = (Tree){size, n, buffers[0].buf, buffers[1].buf, buffers[2].buf, buffers[3].buf,
                  buffers[4].buf, vectors, vectors + n * size, vectors + 2 * n * size,
                  vectors + 3 * n * size, NULL, NULL};
    if (!read_rows(usage, n, size, dens, vectors, "usage") ||
        !read_rows(demand, n, size, dens, vectors + n * size, "demand") ||
        !read_rows(limits, n, size, NULL, vectors + 2 * n * size, "limits") ||
        !read_rows(guarantees, n, size, NULL, vectors + 3 * n * size, "guarantees"))
        goto done;
    if (!well_formed(&tree, n - 1)) {
        PyErr_SetString(PyExc_ValueError, "every child must come after its parent");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * size * (Py_ssize_t)sizeof(double));
    tree.fitted = calloc((size_t)n, sizeof(Fitted));
    if (!result || !tree.fitted) {
        Py_CLEAR(result);
        PyErr_NoMemory();
        goto done;
    }
    tree.fair_share = (double *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    ok = run(&c, &tree);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t e = 0; e < n; e++) free(tree.fitted[e].xs); /* ms and ys share its block */
    if (!ok) { /* every failure is an allocation */
        Py_CLEAR(result);
        PyErr_NoMemory();
    }
done:
    free(tree.fitted);
    free(vectors);
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&buffers[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"update", update, METH_VARARGS, "The float fair-share update of a flattened tree."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_hdrf", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__hdrf(void) { return PyModule_Create(&module); }
