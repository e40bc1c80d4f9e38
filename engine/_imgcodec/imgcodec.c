/*
 * engine._imgcodec._core -- small, fast JPEG helpers on top of the TurboJPEG API
 * (libjpeg-turbo 2.1).
 *
 *   jpeg_size(buf)                               -> (width, height)
 *   decode(buf, scale=1)                         -> (bytearray RGB, width, height)
 *   encode(buf, width, height, quality=80, subsampling="420") -> bytes
 *   frame_diff(a, b, scale=4, threshold=16)      -> (changed_fraction, mean_abs_diff)
 *
 * Design notes
 *  - Inputs are taken through the buffer protocol ("y*": contiguous, no copy), so
 *    bytes, bytearray, memoryview (e.g. over multiprocessing.shared_memory) and
 *    C-contiguous numpy arrays are all accepted as they are.
 *  - All codec work runs with the GIL released.
 *  - TurboJPEG handles are per thread (pthread key with a destructor that frees them
 *    when the thread exits); nothing mutable is shared between threads.
 *  - Any TurboJPEG failure *or warning* (truncated / corrupt data) is an error:
 *    TJFLAG_STOPONWARNING aborts at the first problem, TJFLAG_LIMITSCANS bounds the
 *    work a malicious progressive JPEG can cause.
 *  - Decoding refuses images above MAX_PIXELS so that a tiny corrupt header cannot
 *    make us allocate gigabytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#ifndef TJFLAG_LIMITSCANS /* libjpeg-turbo < 2.1 */
#define TJFLAG_LIMITSCANS 0
#endif

/* Largest decoded image accepted (pixels): 16384 x 16384. */
#define IMGCODEC_MAX_PIXELS ((int64_t)1 << 28)
/* Per-thread frame_diff scratch buffers up to this size are kept between calls. */
#define SCRATCH_KEEP_MAX ((size_t)64 << 20)
#define ERRMSG_LEN 320

static PyObject *ImgCodecError = NULL;

/* ------------------------------------------------------------------------- */
/* Error reporting from GIL-free code                                         */
/* ------------------------------------------------------------------------- */

enum { ST_OK = 0, ST_CODEC = 1, ST_NOMEM = 2 };

typedef struct {
    int kind;
    char msg[ERRMSG_LEN];
} status_t;

static void st_set(status_t *st, int kind, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void st_set(status_t *st, int kind, const char *fmt, ...)
{
    va_list ap;
    st->kind = kind;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* Must be called with the GIL held. Returns NULL for convenience. */
static PyObject *st_raise(const status_t *st)
{
    if (st->kind == ST_NOMEM) {
        if (st->msg[0])
            PyErr_SetString(PyExc_MemoryError, st->msg);
        else
            PyErr_NoMemory();
    } else {
        PyErr_SetString(ImgCodecError, st->msg);
    }
    return NULL;
}

/* The last error string of a handle (or the global one for a NULL handle). */
static const char *tj_err(tjhandle h)
{
    const char *s = tjGetErrorStr2(h);
    return s ? s : "unknown TurboJPEG error";
}

/* ------------------------------------------------------------------------- */
/* Per-thread context                                                         */
/* ------------------------------------------------------------------------- */

typedef struct {
    tjhandle dec;
    tjhandle enc;
    unsigned char *scratch;
    size_t scratch_cap;
} thread_ctx;

static pthread_key_t ctx_key;
static int ctx_key_ready = 0;

static void ctx_destroy(void *p)
{
    thread_ctx *c = (thread_ctx *)p;
    if (!c)
        return;
    if (c->dec)
        tjDestroy(c->dec);
    if (c->enc)
        tjDestroy(c->enc);
    free(c->scratch);
    free(c);
}

/* GIL not required. Returns NULL (and sets st) on failure. */
static thread_ctx *ctx_get(status_t *st)
{
    thread_ctx *c = (thread_ctx *)pthread_getspecific(ctx_key);
    if (c)
        return c;
    c = (thread_ctx *)calloc(1, sizeof *c);
    if (!c) {
        st_set(st, ST_NOMEM, "out of memory allocating the codec context");
        return NULL;
    }
    if (pthread_setspecific(ctx_key, c) != 0) {
        free(c);
        st_set(st, ST_NOMEM, "could not register the per-thread codec context");
        return NULL;
    }
    return c;
}

static tjhandle ctx_decoder(thread_ctx *c, status_t *st)
{
    if (!c->dec) {
        c->dec = tjInitDecompress();
        if (!c->dec)
            st_set(st, ST_NOMEM, "could not create a TurboJPEG decompressor: %s", tj_err(NULL));
    }
    return c->dec;
}

static tjhandle ctx_encoder(thread_ctx *c, status_t *st)
{
    if (!c->enc) {
        c->enc = tjInitCompress();
        if (!c->enc)
            st_set(st, ST_NOMEM, "could not create a TurboJPEG compressor: %s", tj_err(NULL));
    }
    return c->enc;
}

/* ------------------------------------------------------------------------- */
/* Shared helpers (GIL released)                                              */
/* ------------------------------------------------------------------------- */

static int valid_scale(int scale)
{
    return scale == 1 || scale == 2 || scale == 4 || scale == 8;
}

/* After any failure the decompressor may be left mid-stream (tjDecompressHeader3() in 2.1 returns
   without aborting its libjpeg state), so it is dropped and recreated on next use. Errors are rare. */
static void ctx_drop_decoder(thread_ctx *c)
{
    if (c->dec) {
        tjDestroy(c->dec);
        c->dec = NULL;
    }
}

/* Parse the JPEG header. `what` prefixes messages ("", "image a: ", ...). */
static int read_header(thread_ctx *c, const Py_buffer *buf, int *w, int *ht, status_t *st, const char *what)
{
    int subsamp = 0, colorspace = 0;
    tjhandle h;
    if (buf->len <= 0) {
        st_set(st, ST_CODEC, "%sempty JPEG buffer", what);
        return -1;
    }
    if ((uint64_t)buf->len > (uint64_t)ULONG_MAX) {
        st_set(st, ST_CODEC, "%sJPEG buffer too large (%zd bytes)", what, buf->len);
        return -1;
    }
    h = ctx_decoder(c, st);
    if (!h)
        return -1;
    *w = *ht = 0; /* left untouched by TurboJPEG for a tables-only stream */
    if (tjDecompressHeader3(h, (const unsigned char *)buf->buf, (unsigned long)buf->len, w, ht, &subsamp,
                            &colorspace) != 0) {
        st_set(st, ST_CODEC, "%sinvalid JPEG header: %s", what, tj_err(h));
        ctx_drop_decoder(c);
        return -1;
    }
    if (*w <= 0 || *ht <= 0) {
        /* e.g. a tables-only stream: 2.1 returns success without resetting its state */
        st_set(st, ST_CODEC, "%sJPEG stream contains no image (%dx%d)", what, *w, *ht);
        ctx_drop_decoder(c);
        return -1;
    }
    return 0;
}

/* Decoded size at 1/scale (same rounding as TJSCALED: ceil) and its byte count. */
static int scaled_dims(int w, int h, int scale, int *sw, int *sh, size_t *nbytes, status_t *st,
                       const char *what)
{
    int64_t pixels = (int64_t)w * (int64_t)h; /* w, h <= INT_MAX: no overflow in 64 bits */
    if (pixels > IMGCODEC_MAX_PIXELS) {
        st_set(st, ST_CODEC, "%sJPEG too large: %dx%d exceeds the limit of %lld pixels", what, w, h,
               (long long)IMGCODEC_MAX_PIXELS);
        return -1;
    }
    *sw = (int)(((int64_t)w + scale - 1) / scale);
    *sh = (int)(((int64_t)h + scale - 1) / scale);
    /* <= 3 * 2^28: fits size_t and Py_ssize_t; sw * 3 fits int. */
    *nbytes = (size_t)*sw * (size_t)*sh * 3u;
    return 0;
}

/* Decode into dst (sw * sh * 3 bytes). */
static int decode_into(thread_ctx *c, const Py_buffer *buf, unsigned char *dst, int sw, int sh, int flags,
                       status_t *st, const char *what)
{
    tjhandle h = ctx_decoder(c, st);
    if (!h)
        return -1;
    /* Asking for exactly ceil(w/scale) x ceil(h/scale) makes TurboJPEG pick the 1/scale factor
       (or a larger one giving the very same size), so the output is exactly sw x sh. TurboJPEG
       re-reads the header; should the buffer change under us (shared memory being rewritten), it
       still only ever writes an image that fits within sw x sh at this pitch: never out of bounds. */
    if (tjDecompress2(h, (const unsigned char *)buf->buf, (unsigned long)buf->len, dst, sw, sw * 3, sh,
                      TJPF_RGB, flags | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
        st_set(st, ST_CODEC, "%scorrupt or truncated JPEG: %s", what, tj_err(h));
        ctx_drop_decoder(c);
        return -1;
    }
    return 0;
}

static PyObject *bad_scale(int scale)
{
    PyErr_Format(PyExc_ValueError, "scale must be 1, 2, 4 or 8 (got %d)", scale);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* jpeg_size                                                                  */
/* ------------------------------------------------------------------------- */

PyDoc_STRVAR(jpeg_size_doc, "jpeg_size(buf, /)\n--\n\n"
                            "Return (width, height) of a JPEG from its header, without decoding.");

static PyObject *py_jpeg_size(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer buf;
    status_t st = {0};
    int w = 0, h = 0;

    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) != 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    thread_ctx *c = ctx_get(&st);
    if (c)
        read_header(c, &buf, &w, &h, &st, "");
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (st.kind != ST_OK)
        return st_raise(&st);
    return Py_BuildValue("(ii)", w, h);
}

/* ------------------------------------------------------------------------- */
/* decode                                                                     */
/* ------------------------------------------------------------------------- */

PyDoc_STRVAR(decode_doc,
             "decode(buf, scale=1, *, fast=False)\n--\n\n"
             "Decode a JPEG to packed RGB at 1/scale (scale in 1, 2, 4, 8; DCT scaling).\n"
             "fast=True uses the fast integer IDCT and plain upsampling (slightly less accurate).\n"
             "Returns (bytearray, width, height); the bytearray holds height*width*3 bytes.");

static PyObject *py_decode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"buf", "scale", "fast", NULL};
    Py_buffer buf;
    int scale = 1, fast = 0;
    status_t st = {0};
    int w = 0, h = 0, sw = 0, sh = 0;
    size_t nbytes = 0;
    thread_ctx *c = NULL;
    PyObject *out = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|i$p:decode", kwlist, &buf, &scale, &fast))
        return NULL;
    if (!valid_scale(scale)) {
        PyBuffer_Release(&buf);
        return bad_scale(scale);
    }

    Py_BEGIN_ALLOW_THREADS
    c = ctx_get(&st);
    if (c && read_header(c, &buf, &w, &h, &st, "") == 0)
        scaled_dims(w, h, scale, &sw, &sh, &nbytes, &st, "");
    Py_END_ALLOW_THREADS
    if (st.kind != ST_OK)
        goto fail;

    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)nbytes);
    if (!out)
        goto fail_py;

    {
        unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
        /* Same thread, same context: it is only ever used by its own thread. */
        Py_BEGIN_ALLOW_THREADS
        decode_into(c, &buf, dst, sw, sh, fast ? TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE : 0, &st, "");
        Py_END_ALLOW_THREADS
    }
    if (st.kind != ST_OK)
        goto fail;

    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nii)", out, sw, sh);

fail:
    st_raise(&st);
fail_py:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* encode                                                                     */
/* ------------------------------------------------------------------------- */

static int parse_subsampling(const char *s)
{
    if (strcmp(s, "444") == 0)
        return TJSAMP_444;
    if (strcmp(s, "422") == 0)
        return TJSAMP_422;
    if (strcmp(s, "420") == 0)
        return TJSAMP_420;
    if (strcmp(s, "440") == 0)
        return TJSAMP_440;
    if (strcmp(s, "411") == 0)
        return TJSAMP_411;
    if (strcmp(s, "gray") == 0)
        return TJSAMP_GRAY;
    return -1;
}

PyDoc_STRVAR(encode_doc,
             "encode(buf, width, height, quality=80, subsampling=\"420\")\n--\n\n"
             "Encode packed RGB (exactly width*height*3 bytes, row-major) to JPEG bytes.\n"
             "subsampling: \"444\", \"422\", \"420\", \"440\", \"411\" or \"gray\".");

static PyObject *py_encode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"buf", "width", "height", "quality", "subsampling", NULL};
    Py_buffer buf;
    int width = 0, height = 0, quality = 80, subsamp;
    const char *subs = "420";
    status_t st = {0};
    unsigned char *jpeg = NULL;
    unsigned long jpeg_len = 0;
    PyObject *out;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*ii|is:encode", kwlist, &buf, &width, &height,
                                     &quality, &subs))
        return NULL;
    if (width <= 0 || height <= 0 || width > 65500 || height > 65500) { /* libjpeg's JPEG_MAX_DIMENSION */
        PyErr_Format(PyExc_ValueError, "width and height must be in 1..65500 (got %dx%d)", width, height);
        goto fail_py;
    }
    if (quality < 1 || quality > 100) {
        PyErr_Format(PyExc_ValueError, "quality must be in 1..100 (got %d)", quality);
        goto fail_py;
    }
    subsamp = parse_subsampling(subs);
    if (subsamp < 0) {
        PyErr_Format(PyExc_ValueError,
                     "subsampling must be one of '444', '422', '420', '440', '411', 'gray' (got '%.50s')",
                     subs);
        goto fail_py;
    }
    {
        /* width, height <= 65500: the product fits easily in 64 bits. */
        int64_t expected = (int64_t)width * (int64_t)height * 3;
        if ((int64_t)buf.len != expected) {
            PyErr_Format(ImgCodecError, "RGB buffer has %zd bytes, expected %dx%dx3 = %lld", buf.len, width,
                         height, (long long)expected);
            goto fail_py;
        }
    }

    Py_BEGIN_ALLOW_THREADS
    thread_ctx *c = ctx_get(&st);
    tjhandle th = c ? ctx_encoder(c, &st) : NULL;
    if (th && tjCompress2(th, (const unsigned char *)buf.buf, width, width * 3, height, TJPF_RGB, &jpeg,
                          &jpeg_len, subsamp, quality, 0) != 0) {
        st_set(&st, ST_CODEC, "JPEG encode failed: %s", tj_err(th));
        tjDestroy(th); /* do not reuse a compressor left in an unknown state */
        c->enc = NULL;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);

    if (st.kind != ST_OK) {
        tjFree(jpeg);
        return st_raise(&st);
    }
    if (jpeg_len > (unsigned long)PY_SSIZE_T_MAX) {
        tjFree(jpeg);
        return PyErr_NoMemory();
    }
    out = PyBytes_FromStringAndSize((const char *)jpeg, (Py_ssize_t)jpeg_len);
    tjFree(jpeg);
    return out;

fail_py:
    PyBuffer_Release(&buf);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* frame_diff                                                                 */
/* ------------------------------------------------------------------------- */

/* One pass, integers only. Returns the number of pixels whose largest channel difference is
   > threshold; *sum receives the sum of all absolute channel differences. */
static uint64_t diff_rgb(const unsigned char *restrict a, const unsigned char *restrict b, size_t npix,
                         int threshold, uint64_t *sum)
{
    uint64_t changed = 0, total = 0;
    const unsigned int thr = (unsigned int)threshold;
    /* Row-sized chunks keep the inner accumulators in 32 bits (<= 4096 * 765 per chunk). */
    while (npix) {
        size_t n = npix < 4096 ? npix : 4096;
        uint32_t s = 0, cnt = 0;
        for (size_t i = 0; i < n; i++) {
            int d0 = (int)a[0] - (int)b[0];
            int d1 = (int)a[1] - (int)b[1];
            int d2 = (int)a[2] - (int)b[2];
            unsigned int e0 = (unsigned int)(d0 < 0 ? -d0 : d0);
            unsigned int e1 = (unsigned int)(d1 < 0 ? -d1 : d1);
            unsigned int e2 = (unsigned int)(d2 < 0 ? -d2 : d2);
            unsigned int m = e0 > e1 ? e0 : e1;
            m = m > e2 ? m : e2;
            s += e0 + e1 + e2;
            cnt += m > thr;
            a += 3;
            b += 3;
        }
        total += s;
        changed += cnt;
        npix -= n;
    }
    *sum = total;
    return changed;
}

PyDoc_STRVAR(frame_diff_doc,
             "frame_diff(a, b, scale=4, threshold=16)\n--\n\n"
             "Decode two JPEGs at 1/scale and compare them. Returns (changed_fraction, mean_abs_diff):\n"
             "the fraction of pixels whose largest per-channel absolute difference exceeds threshold, and\n"
             "the mean absolute difference over all channels (0..255). Images of different dimensions give\n"
             "(1.0, 255.0); byte-identical inputs give (0.0, 0.0) after only a header check.");

static PyObject *py_frame_diff(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"a", "b", "scale", "threshold", NULL};
    Py_buffer ba, bb;
    int scale = 4, threshold = 16;
    status_t st = {0};
    double frac = 0.0, mad = 0.0;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*|ii:frame_diff", kwlist, &ba, &bb, &scale,
                                     &threshold))
        return NULL;
    if (!valid_scale(scale)) {
        PyBuffer_Release(&ba);
        PyBuffer_Release(&bb);
        return bad_scale(scale);
    }
    if (threshold < 0 || threshold > 255) {
        PyBuffer_Release(&ba);
        PyBuffer_Release(&bb);
        PyErr_Format(PyExc_ValueError, "threshold must be in 0..255 (got %d)", threshold);
        return NULL;
    }

    Py_BEGIN_ALLOW_THREADS
    do {
        int wa = 0, ha = 0, wb = 0, hb = 0, sw = 0, sh = 0;
        size_t nbytes, need;
        unsigned char *scratch, *tmp = NULL;
        uint64_t changed, sum = 0, npix;
        thread_ctx *c = ctx_get(&st);
        if (!c)
            break;
        if (read_header(c, &ba, &wa, &ha, &st, "image a: ") != 0)
            break;
        if (ba.len == bb.len && (ba.buf == bb.buf || memcmp(ba.buf, bb.buf, (size_t)ba.len) == 0)) {
            frac = 0.0; /* identical bytes decode identically */
            mad = 0.0;
            break;
        }
        if (read_header(c, &bb, &wb, &hb, &st, "image b: ") != 0)
            break;
        if (wa != wb || ha != hb) {
            frac = 1.0; /* different geometry: treat as a completely new page */
            mad = 255.0;
            break;
        }
        if (scaled_dims(wa, ha, scale, &sw, &sh, &nbytes, &st, "") != 0)
            break;
        need = 2 * nbytes; /* nbytes <= 3 * 2^28, no overflow */
        if (need <= c->scratch_cap) {
            scratch = c->scratch;
        } else if (need <= SCRATCH_KEEP_MAX) {
            unsigned char *p = (unsigned char *)malloc(need);
            if (!p) {
                st_set(&st, ST_NOMEM, "out of memory allocating %zu bytes of scratch", need);
                break;
            }
            free(c->scratch);
            c->scratch = scratch = p;
            c->scratch_cap = need;
        } else {
            tmp = scratch = (unsigned char *)malloc(need);
            if (!tmp) {
                st_set(&st, ST_NOMEM, "out of memory allocating %zu bytes of scratch", need);
                break;
            }
        }
        /* Both frames go through the same (fast) path, so its small inaccuracies cancel out. */
        if (decode_into(c, &ba, scratch, sw, sh, TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE, &st, "image a: ") ==
                0 &&
            decode_into(c, &bb, scratch + nbytes, sw, sh, TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE, &st,
                        "image b: ") == 0) {
            npix = (uint64_t)sw * (uint64_t)sh;
            changed = diff_rgb(scratch, scratch + nbytes, (size_t)npix, threshold, &sum);
            frac = (double)changed / (double)npix;
            mad = (double)sum / (3.0 * (double)npix);
        }
        free(tmp);
    } while (0);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    if (st.kind != ST_OK)
        return st_raise(&st);
    return Py_BuildValue("(dd)", frac, mad);
}

/* ------------------------------------------------------------------------- */
/* Module                                                                     */
/* ------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"jpeg_size", (PyCFunction)py_jpeg_size, METH_O, jpeg_size_doc},
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_VARARGS | METH_KEYWORDS, decode_doc},
    {"encode", (PyCFunction)(void (*)(void))py_encode, METH_VARARGS | METH_KEYWORDS, encode_doc},
    {"frame_diff", (PyCFunction)(void (*)(void))py_frame_diff, METH_VARARGS | METH_KEYWORDS, frame_diff_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "_core",
    "JPEG decode/encode/frame-difference helpers on TurboJPEG (GIL released, thread-safe).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m;

    if (!ctx_key_ready) {
        int rc = pthread_key_create(&ctx_key, ctx_destroy);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "pthread_key_create failed (%d)", rc);
            return NULL;
        }
        ctx_key_ready = 1;
    }
    m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (!ImgCodecError) {
        ImgCodecError = PyErr_NewExceptionWithDoc(
            "engine._imgcodec.ImgCodecError",
            "Corrupt, truncated, empty or otherwise undecodable image data (a ValueError).",
            PyExc_ValueError, NULL);
        if (!ImgCodecError)
            goto fail;
    }
    if (PyModule_AddObjectRef(m, "ImgCodecError", ImgCodecError) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "MAX_PIXELS", (long)IMGCODEC_MAX_PIXELS) < 0)
        goto fail;
    return m;

fail:
    Py_DECREF(m);
    return NULL;
}
