/*
 * engine._imgcodec._core -- small, fast JPEG helpers on top of the TurboJPEG API
 * (libjpeg-turbo 2.1).
 *
 *   jpeg_size(buf)                               -> (width, height)
 *   decode(buf, scale=1, *, fast=False, out=None) -> (bytearray RGB or out, width, height)
 *   encode(buf, width, height, quality=80, subsampling="420", *, fast=False, out=None) -> bytes | int
 *   frame_diff(a, b, scale=4, threshold=16)      -> (changed_fraction, mean_abs_diff)
 *   resize(src, w, h, dst, out_w, out_h)         -> None (area average down, bilinear up; fixed point)
 *   draw_som(img, w, h, boxes, palette, font, ...) -> None (Set-of-Marks overlay, in place)
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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
             "decode(buf, scale=1, *, fast=False, out=None)\n--\n\n"
             "Decode a JPEG to packed RGB at 1/scale (scale in 1, 2, 4, 8; DCT scaling).\n"
             "fast=True uses the fast integer IDCT and plain upsampling (slightly less accurate).\n"
             "Returns (bytearray, width, height); the bytearray holds height*width*3 bytes.\n"
             "out, if given, must be a writable C-contiguous uint8 buffer of shape (height, width, 3)\n"
             "(e.g. a numpy array) not overlapping buf; the image is decoded straight into it and\n"
             "(out, width, height) is returned. ValueError otherwise.");

static int buffers_overlap(const Py_buffer *a, const Py_buffer *b)
{
    return (const char *)a->buf < (const char *)b->buf + b->len &&
           (const char *)b->buf < (const char *)a->buf + a->len;
}

static PyObject *py_decode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"buf", "scale", "fast", "out", NULL};
    Py_buffer buf, obuf;
    int scale = 1, fast = 0, have_obuf = 0;
    status_t st = {0};
    int w = 0, h = 0, sw = 0, sh = 0;
    size_t nbytes = 0;
    thread_ctx *c = NULL;
    PyObject *out = NULL, *out_arg = Py_None;
    unsigned char *dst = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|i$pO:decode", kwlist, &buf, &scale, &fast, &out_arg))
        return NULL;
    if (!valid_scale(scale)) {
        PyBuffer_Release(&buf);
        return bad_scale(scale);
    }
    if (out_arg != Py_None) {
        if (PyObject_GetBuffer(out_arg, &obuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "decode: out must be a writable C-contiguous uint8 array");
            goto fail_py;
        }
        have_obuf = 1;
        if (obuf.itemsize != 1 || (obuf.format && strcmp(obuf.format, "B") != 0) || obuf.ndim != 3 ||
            !obuf.shape || obuf.shape[2] != 3) {
            PyErr_SetString(PyExc_ValueError, "decode: out must be a writable C-contiguous (H, W, 3) uint8 array");
            goto fail_py;
        }
        if (buffers_overlap(&buf, &obuf)) {
            PyErr_SetString(PyExc_ValueError, "decode: out overlaps the input buffer");
            goto fail_py;
        }
    }

    Py_BEGIN_ALLOW_THREADS
    c = ctx_get(&st);
    if (c && read_header(c, &buf, &w, &h, &st, "") == 0)
        scaled_dims(w, h, scale, &sw, &sh, &nbytes, &st, "");
    Py_END_ALLOW_THREADS
    if (st.kind != ST_OK)
        goto fail;

    if (have_obuf) {
        if (obuf.shape[0] != (Py_ssize_t)sh || obuf.shape[1] != (Py_ssize_t)sw ||
            (size_t)obuf.len != nbytes) {
            PyErr_Format(PyExc_ValueError,
                         "decode: out has shape (%zd, %zd, %zd), expected (%d, %d, 3) for this image at scale %d",
                         obuf.shape[0], obuf.shape[1], obuf.shape[2], sh, sw, scale);
            goto fail_py;
        }
        out = out_arg;
        Py_INCREF(out);
        dst = (unsigned char *)obuf.buf;
    } else {
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)nbytes);
        if (!out)
            goto fail_py;
        dst = (unsigned char *)PyByteArray_AS_STRING(out);
    }

    /* Same thread, same context: it is only ever used by its own thread. dst holds exactly
       sh * sw * 3 bytes (checked above for out). */
    Py_BEGIN_ALLOW_THREADS
    decode_into(c, &buf, dst, sw, sh, fast ? TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE : 0, &st, "");
    Py_END_ALLOW_THREADS
    if (st.kind != ST_OK)
        goto fail;

    PyBuffer_Release(&buf);
    if (have_obuf)
        PyBuffer_Release(&obuf);
    return Py_BuildValue("(Nii)", out, sw, sh);

fail:
    st_raise(&st);
fail_py:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    if (have_obuf)
        PyBuffer_Release(&obuf);
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
             "encode(buf, width, height, quality=80, subsampling=\"420\", *, fast=False, out=None)\n--\n\n"
             "Encode packed RGB (exactly width*height*3 bytes, row-major) to JPEG bytes.\n"
             "subsampling: \"444\", \"422\", \"420\", \"440\", \"411\" or \"gray\".\n"
             "fast=True uses the fast integer forward DCT (slightly less accurate).\n"
             "out, if given, is a writable contiguous buffer of at least tjBufSize(width, height,\n"
             "subsampling) bytes, not overlapping buf: the JPEG is written straight into it\n"
             "(TJFLAG_NOREALLOC) and the number of bytes written is returned.");

static PyObject *py_encode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"buf", "width", "height", "quality", "subsampling", "fast", "out", NULL};
    Py_buffer buf, obuf;
    int width = 0, height = 0, quality = 80, subsamp, fast = 0, have_obuf = 0, flags;
    const char *subs = "420";
    status_t st = {0};
    unsigned char *jpeg = NULL;
    unsigned long jpeg_len = 0;
    PyObject *out, *out_arg = Py_None;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*ii|is$pO:encode", kwlist, &buf, &width, &height,
                                     &quality, &subs, &fast, &out_arg))
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
    flags = fast ? TJFLAG_FASTDCT : 0;
    if (out_arg != Py_None) {
        unsigned long need = tjBufSize(width, height, subsamp);
        if (PyObject_GetBuffer(out_arg, &obuf, PyBUF_WRITABLE) != 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "encode: out must be a writable contiguous buffer");
            goto fail_py;
        }
        have_obuf = 1;
        if (need == (unsigned long)-1) {
            PyErr_Format(PyExc_ValueError, "encode: tjBufSize failed: %s", tj_err(NULL));
            goto fail_py;
        }
        if ((uint64_t)obuf.len < (uint64_t)need) {
            PyErr_Format(PyExc_ValueError,
                         "encode: out buffer too small: %zd bytes, need at least %lu (tjBufSize for %dx%d, "
                         "subsampling '%.10s')",
                         obuf.len, need, width, height, subs);
            goto fail_py;
        }
        if (buffers_overlap(&buf, &obuf)) {
            PyErr_SetString(PyExc_ValueError, "encode: out overlaps the input buffer");
            goto fail_py;
        }
        /* TurboJPEG writes at most tjBufSize(...) <= obuf.len bytes and never reallocates. */
        jpeg = (unsigned char *)obuf.buf;
        jpeg_len = need;
        flags |= TJFLAG_NOREALLOC;
    }

    Py_BEGIN_ALLOW_THREADS
    thread_ctx *c = ctx_get(&st);
    tjhandle th = c ? ctx_encoder(c, &st) : NULL;
    if (th && tjCompress2(th, (const unsigned char *)buf.buf, width, width * 3, height, TJPF_RGB, &jpeg,
                          &jpeg_len, subsamp, quality, flags) != 0) {
        st_set(&st, ST_CODEC, "JPEG encode failed: %s", tj_err(th));
        tjDestroy(th); /* do not reuse a compressor left in an unknown state */
        c->enc = NULL;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);

    if (have_obuf) {
        Py_ssize_t olen = obuf.len;
        PyBuffer_Release(&obuf);
        if (st.kind != ST_OK)
            return st_raise(&st);
        if ((uint64_t)jpeg_len > (uint64_t)olen) { /* cannot happen with TJFLAG_NOREALLOC */
            PyErr_SetString(PyExc_RuntimeError, "encode: TurboJPEG reported more bytes than the out buffer holds");
            return NULL;
        }
        return PyLong_FromUnsignedLong(jpeg_len);
    }
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
    if (have_obuf)
        PyBuffer_Release(&obuf);
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
/* resize                                                                     */
/* ------------------------------------------------------------------------- */

/* Fixed-point resize. Weights are 14-bit (each output's weights sum to exactly 1 << RS_WBITS), the
   horizontal pass keeps 8 fractional bits in uint16 rows (<= 255 << 8), and the vertical pass
   accumulates uint16 * weight products in int32 (<= 65280 << 14 < 2^31), rounding at the end. The
   horizontally filtered rows live in a small ring (one row per vertical tap): no full-image buffer. */
#define RS_WBITS 14
#define RS_ONE (1 << RS_WBITS)
#define RS_HSHIFT 6                      /* 14-bit weights * 8-bit pixels -> 8 fractional bits */
#define RS_VSHIFT (RS_WBITS + RS_WBITS - RS_HSHIFT) /* 22 */

/* Per output sample along one axis: the first contributing source index, how many, and weights. */
typedef struct {
    int *start;
    int *count;
    int32_t *w; /* count[i] weights for output i, at offset i * maxn; they sum to RS_ONE */
    int maxn;
} axis_t;

static void axis_free(axis_t *a)
{
    free(a->start);
    free(a->count);
    free(a->w);
    a->start = a->count = NULL;
    a->w = NULL;
}

/* Downscale (n_out < n_in): exact box filter, output i covers [i*s, (i+1)*s) with s = n_in/n_out and
   fractional weights at the ends. Otherwise bilinear with half-pixel centres, edges clamped.
   Weights are rounded to RS_WBITS bits; the largest absorbs the rounding so the sum is exact. */
static int axis_init(axis_t *a, int n_in, int n_out)
{
    double s = (double)n_in / (double)n_out;
    int maxn = n_out < n_in ? (n_in + n_out - 1) / n_out + 2 : 2; /* ceil(s) + 2 */
    a->maxn = maxn;
    a->start = (int *)malloc(sizeof(int) * (size_t)n_out);
    a->count = (int *)malloc(sizeof(int) * (size_t)n_out);
    a->w = (int32_t *)calloc((size_t)n_out * (size_t)maxn, sizeof(int32_t));
    if (!a->start || !a->count || !a->w) {
        axis_free(a);
        return -1;
    }
    for (int i = 0; i < n_out; i++) {
        int32_t *w = a->w + (size_t)i * (size_t)maxn;
        if (n_out < n_in) {
            /* Integer arithmetic for the bounds: [i*n_in, (i+1)*n_in) in units of 1/n_out pixels. */
            int64_t lo = (int64_t)i * n_in, hi = (int64_t)(i + 1) * n_in;
            int j0 = (int)(lo / n_out), j1 = (int)((hi + n_out - 1) / n_out); /* [j0, j1) */
            int n = 0, big = 0;
            int32_t sum = 0;
            if (j1 > n_in)
                j1 = n_in;
            for (int j = j0; j < j1 && n < maxn; j++) {
                int64_t a0 = (int64_t)j * n_out, a1 = (int64_t)(j + 1) * n_out;
                int64_t ov = (a1 < hi ? a1 : hi) - (a0 > lo ? a0 : lo);
                w[n] = (int32_t)((ov * RS_ONE + n_in / 2) / n_in);
                sum += w[n];
                if (w[n] > w[big])
                    big = n;
                n++;
            }
            w[big] += RS_ONE - sum;
            a->start[i] = j0;
            a->count[i] = n;
        } else {
            double x = ((double)i + 0.5) * s - 0.5;
            int j0;
            int32_t f;
            if (x < 0)
                x = 0;
            j0 = (int)x; /* x >= 0: truncation is floor */
            if (j0 >= n_in - 1) {
                a->start[i] = n_in - 1;
                a->count[i] = 1;
                w[0] = RS_ONE;
                continue;
            }
            f = (int32_t)((x - j0) * RS_ONE + 0.5);
            a->start[i] = j0;
            a->count[i] = 2;
            w[0] = RS_ONE - f;
            w[1] = f;
        }
    }
    return 0;
}

/* One output pixel of the horizontal pass (any tap count), 8 fractional bits. */
static inline void resize_hpix(const unsigned char *p, const int32_t *w, int n, uint16_t *o)
{
    int32_t r, g, b;
    if (n == 2) { /* bilinear: the common upscale case */
        r = w[0] * p[0] + w[1] * p[3];
        g = w[0] * p[1] + w[1] * p[4];
        b = w[0] * p[2] + w[1] * p[5];
    } else if (n == 3) {
        r = w[0] * p[0] + w[1] * p[3] + w[2] * p[6];
        g = w[0] * p[1] + w[1] * p[4] + w[2] * p[7];
        b = w[0] * p[2] + w[1] * p[5] + w[2] * p[8];
    } else {
        r = g = b = 0;
        for (int k = 0; k < n; k++, p += 3) {
            r += w[k] * p[0];
            g += w[k] * p[1];
            b += w[k] * p[2];
        }
    }
    o[0] = (uint16_t)((r + (1 << (RS_HSHIFT - 1))) >> RS_HSHIFT);
    o[1] = (uint16_t)((g + (1 << (RS_HSHIFT - 1))) >> RS_HSHIFT);
    o[2] = (uint16_t)((b + (1 << (RS_HSHIFT - 1))) >> RS_HSHIFT);
}

/* One source row -> wo * 3 uint16 values with 8 fractional bits. With SSE2 and wv (per output
   pixel the int16 weights {w0, w1, w0, w1, w0, w1, 0, 0}), two-tap pixels take one pmaddwd; this
   path reads 4 bytes at p + 3 (so it is skipped where that would pass src_end) and stores 4 uint16
   at o (so each ring row has slack after it). */
static void resize_hrow(const unsigned char *restrict row, const axis_t *ax, const int16_t *wv, int wo,
                        uint16_t *restrict o, const unsigned char *src_end)
{
    const int maxn = ax->maxn;
#if defined(__SSE2__)
    if (wv) {
        const __m128i bias = _mm_set1_epi32((1 << (RS_HSHIFT - 1)) - (1 << (RS_HSHIFT + 15)));
        const __m128i flip = _mm_set1_epi16((short)0x8000);
        const __m128i zero = _mm_setzero_si128();
        for (int x = 0; x < wo; x++, o += 3) {
            const unsigned char *p = row + (size_t)ax->start[x] * 3u;
            int32_t a, b;
            __m128i v, s;
            if (ax->count[x] != 2 || src_end - p < 7) {
                resize_hpix(p, ax->w + (size_t)x * (size_t)maxn, ax->count[x], o);
                continue;
            }
            memcpy(&a, p, 4);
            memcpy(&b, p + 3, 4);
            v = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(a), zero),
                                   _mm_unpacklo_epi8(_mm_cvtsi32_si128(b), zero)); /* r0 r1 g0 g1 b0 b1 . . */
            s = _mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)(wv + (size_t)x * 8u)));
            /* (s + half) >> 6 is in 0..65280: shift it by -32768 to pack with signed saturation. */
            s = _mm_srai_epi32(_mm_add_epi32(s, bias), RS_HSHIFT);
            s = _mm_xor_si128(_mm_packs_epi32(s, s), flip);
            _mm_storel_epi64((__m128i *)(void *)o, s);
        }
        return;
    }
#else
    (void)wv;
    (void)src_end;
#endif
    for (int x = 0; x < wo; x++, o += 3)
        resize_hpix(row + (size_t)ax->start[x] * 3u, ax->w + (size_t)x * (size_t)maxn, ax->count[x], o);
}

static int resize_rgb(const unsigned char *src, int wi, int hi, unsigned char *dst, int wo, int ho, status_t *st)
{
    axis_t ax = {0}, ay = {0};
    uint16_t *ring = NULL;
    int32_t *acc = NULL;
    int *ring_row = NULL;
    int16_t *wv = NULL;
    int rc = -1, nring;
    const size_t rowlen = (size_t)wo * 3u, stride = rowlen + 4u; /* slack for the SSE2 store */
    const unsigned char *src_end = src + (size_t)wi * (size_t)hi * 3u;
    if (axis_init(&ax, wi, wo) != 0 || axis_init(&ay, hi, ho) != 0)
        goto nomem;
    nring = ay.maxn;
    ring = (uint16_t *)malloc(sizeof(uint16_t) * stride * (size_t)nring);
    ring_row = (int *)malloc(sizeof(int) * (size_t)nring);
    acc = (int32_t *)malloc(sizeof(int32_t) * rowlen);
    if (!ring || !ring_row || !acc)
        goto nomem;
    for (int k = 0; k < nring; k++)
        ring_row[k] = -1;
#if defined(__SSE2__)
    if (ax.maxn == 2) { /* bilinear axis: int16 weight vectors for pmaddwd */
        wv = (int16_t *)calloc((size_t)wo * 8u, sizeof(int16_t));
        if (!wv)
            goto nomem;
        for (int x = 0; x < wo; x++)
            for (int c = 0; c < 3; c++) {
                wv[8 * x + 2 * c] = (int16_t)ax.w[2 * x];
                wv[8 * x + 2 * c + 1] = (int16_t)ax.w[2 * x + 1];
            }
    }
#endif
    for (int y = 0; y < ho; y++) {
        const int32_t *w = ay.w + (size_t)y * (size_t)ay.maxn;
        const int j0 = ay.start[y], n = ay.count[y];
        const uint16_t *rows[3];
        unsigned char *restrict o = dst + (size_t)y * rowlen;
        /* The tap windows move forward monotonically and hold <= nring rows: slot j % nring. */
        for (int k = 0; k < n; k++) {
            int j = j0 + k, slot = j % nring;
            if (ring_row[slot] != j) {
                resize_hrow(src + (size_t)j * (size_t)wi * 3u, &ax, wv, wo, ring + (size_t)slot * stride, src_end);
                ring_row[slot] = j;
            }
            if (k < 3)
                rows[k] = ring + (size_t)slot * stride;
        }
        {
            const int32_t vhalf = 1 << (RS_VSHIFT - 1);
            if (n == 1) {
                const uint16_t *restrict r0 = rows[0];
                for (size_t i = 0; i < rowlen; i++)
                    o[i] = (unsigned char)((r0[i] + (1 << (RS_HSHIFT + 1))) >> (RS_VSHIFT - RS_WBITS));
            } else if (n == 2) {
                const uint16_t *restrict r0 = rows[0], *restrict r1 = rows[1];
                const int32_t w0 = w[0], w1 = w[1];
                for (size_t i = 0; i < rowlen; i++) {
                    int32_t v = (w0 * (int32_t)r0[i] + w1 * (int32_t)r1[i] + vhalf) >> RS_VSHIFT;
                    o[i] = (unsigned char)(v > 255 ? 255 : v);
                }
            } else if (n == 3) {
                const uint16_t *restrict r0 = rows[0], *restrict r1 = rows[1], *restrict r2 = rows[2];
                const int32_t w0 = w[0], w1 = w[1], w2 = w[2];
                for (size_t i = 0; i < rowlen; i++) {
                    int32_t v =
                        (w0 * (int32_t)r0[i] + w1 * (int32_t)r1[i] + w2 * (int32_t)r2[i] + vhalf) >> RS_VSHIFT;
                    o[i] = (unsigned char)(v > 255 ? 255 : v);
                }
            } else {
                for (size_t i = 0; i < rowlen; i++)
                    acc[i] = vhalf;
                for (int k = 0; k < n; k++) {
                    const uint16_t *restrict r = ring + (size_t)((j0 + k) % nring) * stride;
                    const int32_t wk = w[k];
                    for (size_t i = 0; i < rowlen; i++)
                        acc[i] += wk * (int32_t)r[i];
                }
                for (size_t i = 0; i < rowlen; i++) {
                    int32_t v = acc[i] >> RS_VSHIFT;
                    o[i] = (unsigned char)(v > 255 ? 255 : v);
                }
            }
        }
    }
    rc = 0;
    goto done;
nomem:
    st_set(st, ST_NOMEM, "out of memory in resize");
done:
    free(ring);
    free(ring_row);
    free(acc);
    free(wv);
    axis_free(&ax);
    axis_free(&ay);
    return rc;
}

PyDoc_STRVAR(resize_doc,
             "resize(src, width, height, dst, out_width, out_height)\n--\n\n"
             "Resize packed RGB src (width*height*3 bytes) into the writable buffer dst\n"
             "(out_width*out_height*3 bytes). Per axis: exact area averaging when shrinking,\n"
             "bilinear with half-pixel centres otherwise. The GIL is released.");

static PyObject *py_resize(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer src, dst;
    int wi, hi, wo, ho;
    status_t st = {0};

    if (!PyArg_ParseTuple(args, "y*iiw*ii:resize", &src, &wi, &hi, &dst, &wo, &ho))
        return NULL;
    if (wi <= 0 || hi <= 0 || wo <= 0 || ho <= 0 || (int64_t)wi * hi > IMGCODEC_MAX_PIXELS ||
        (int64_t)wo * ho > IMGCODEC_MAX_PIXELS) {
        PyErr_Format(PyExc_ValueError, "bad resize geometry %dx%d -> %dx%d", wi, hi, wo, ho);
        goto fail;
    }
    if ((int64_t)src.len != (int64_t)wi * hi * 3 || (int64_t)dst.len != (int64_t)wo * ho * 3) {
        PyErr_Format(PyExc_ValueError, "buffer sizes %zd, %zd do not match %dx%dx3 -> %dx%dx3", src.len, dst.len,
                     wi, hi, wo, ho);
        goto fail;
    }
    if ((const char *)src.buf < (const char *)dst.buf + dst.len &&
        (const char *)dst.buf < (const char *)src.buf + src.len) {
        PyErr_SetString(PyExc_ValueError, "resize: src and dst buffers overlap");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    resize_rgb((const unsigned char *)src.buf, wi, hi, (unsigned char *)dst.buf, wo, ho, &st);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (st.kind != ST_OK)
        return st_raise(&st);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* draw_som                                                                   */
/* ------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *palette; /* npal * 3 */
    int64_t npal;
    const unsigned char *font; /* 10 * gh * gw, one byte per pixel (0/1), digits '0'..'9' */
    int64_t gh, gw, gap, pad, alpha, outline;
} som_style;

static int64_t i64min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Fill [y0, y1) x [x0, x1) (already clipped to the image) with a colour. */
static void som_rect(unsigned char *img, int64_t w, int64_t y0, int64_t y1, int64_t x0, int64_t x1,
                     const unsigned char *col)
{
    for (int64_t y = y0; y < y1; y++) {
        unsigned char *p = img + ((size_t)y * (size_t)w + (size_t)x0) * 3u;
        for (int64_t x = x0; x < x1; x++, p += 3) {
            p[0] = col[0];
            p[1] = col[1];
            p[2] = col[2];
        }
    }
}

#define SOM_PAT 768 /* fill chunk (bytes), a multiple of 3 */

/* Mirrors engine/_imgcodec/_som.py:_draw_som_numpy exactly (the tests compare the two). */
static void som_draw(unsigned char *img, int64_t w, int64_t h, const int64_t *boxes, int64_t nbox,
                     const som_style *sty)
{
    const unsigned a = (unsigned)sty->alpha;
    const uint16_t na16 = (uint16_t)(256u - (unsigned)sty->alpha);
    const int64_t t = sty->outline;
    uint16_t pat[SOM_PAT];
    for (int64_t b = 0; b < nbox; b++) {
        const int64_t *bx = boxes + 5 * b;
        int64_t bid = bx[0], bx0 = bx[1], by0 = bx[2], bx1 = bx[3], by1 = bx[4];
        int64_t x0 = i64max(bx0, 0), y0 = i64max(by0, 0), x1 = i64min(bx1, w), y1 = i64min(by1, h);
        const unsigned char *col;
        unsigned char fg[3];
        char digits[24];
        int nd = 0;
        int64_t lw, lh, lx, ly;
        if (x1 <= x0 || y1 <= y0)
            continue;
        col = sty->palette + 3 * (bid % sty->npal);
        /* translucent fill, on the bytes of each row against a 3-periodic colour pattern so that it
           vectorises; p * na + c * a + 128 <= 255 * 256 + 128 fits 16 bits */
        {
            const size_t n = (size_t)(x1 - x0) * 3u;
            for (int k = 0; k < SOM_PAT; k++)
                pat[k] = (uint16_t)(col[k % 3] * a + 128u);
            for (int64_t y = y0; y < y1; y++) {
                unsigned char *restrict p = img + ((size_t)y * (size_t)w + (size_t)x0) * 3u;
                for (size_t off = 0; off < n; off += SOM_PAT, p += SOM_PAT) {
                    const size_t m = n - off < SOM_PAT ? n - off : SOM_PAT;
                    for (size_t i = 0; i < m; i++)
                        p[i] = (unsigned char)((uint16_t)((uint16_t)p[i] * na16 + pat[i]) >> 8);
                }
            }
        }
        /* outline on the edges that lie inside the image */
        if (by0 >= 0)
            som_rect(img, w, y0, i64min(by0 + t, y1), x0, x1, col);
        if (by1 <= h)
            som_rect(img, w, i64max(by1 - t, y0), y1, x0, x1, col);
        if (bx0 >= 0)
            som_rect(img, w, y0, y1, x0, i64min(bx0 + t, x1), col);
        if (bx1 <= w)
            som_rect(img, w, y0, y1, i64max(bx1 - t, x0), x1, col);
        /* label */
        {
            int64_t v = bid;
            char rev[24];
            do {
                rev[nd++] = (char)('0' + v % 10);
                v /= 10;
            } while (v && nd < 20);
            for (int k = 0; k < nd; k++)
                digits[k] = rev[nd - 1 - k];
        }
        lw = nd * sty->gw + (nd - 1) * sty->gap + 2 * sty->pad;
        lh = sty->gh + 2 * sty->pad;
        lx = bx0;
        ly = by0 - lh >= 0 ? by0 - lh : by0;
        lx = i64max(0, i64min(lx, w - lw));
        ly = i64max(0, i64min(ly, h - lh));
        som_rect(img, w, ly, i64min(ly + lh, h), lx, i64min(lx + lw, w), col);
        if (299 * col[0] + 587 * col[1] + 114 * col[2] > 150000)
            fg[0] = fg[1] = fg[2] = 0;
        else
            fg[0] = fg[1] = fg[2] = 255;
        for (int k = 0; k < nd; k++) {
            const unsigned char *g = sty->font + (size_t)(digits[k] - '0') * (size_t)(sty->gh * sty->gw);
            int64_t gx = lx + sty->pad + k * (sty->gw + sty->gap), gy = ly + sty->pad;
            for (int64_t r = 0; r < sty->gh && gy + r < h; r++)
                for (int64_t c = 0; c < sty->gw && gx + c < w; c++)
                    if (g[r * sty->gw + c]) {
                        unsigned char *p = img + ((size_t)(gy + r) * (size_t)w + (size_t)(gx + c)) * 3u;
                        p[0] = fg[0];
                        p[1] = fg[1];
                        p[2] = fg[2];
                    }
        }
    }
}

PyDoc_STRVAR(draw_som_doc,
             "draw_som(img, width, height, boxes, palette, font, gh, gw, gap, pad, alpha, outline)\n--\n\n"
             "Low-level Set-of-Marks drawing, in place, on packed RGB img (writable, width*height*3 bytes).\n"
             "boxes: native int64 (n, 5) rows (id >= 0, x0, y0, x1, y1), |coordinates| < 2**31; palette:\n"
             "uint8 (P, 3); font: uint8 (10, gh, gw) 0/1 digit masks. Use engine._imgcodec.draw_som.");

static PyObject *py_draw_som(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer img, boxes, pal, font;
    int width, height;
    som_style sty;
    long long gh, gw, gap, pad, alpha, outline;
    PyObject *ret = NULL;

    if (!PyArg_ParseTuple(args, "w*iiy*y*y*LLLLLL:draw_som", &img, &width, &height, &boxes, &pal, &font, &gh,
                          &gw, &gap, &pad, &alpha, &outline))
        return NULL;
    if (width <= 0 || height <= 0 || (int64_t)img.len != (int64_t)width * height * 3) {
        PyErr_Format(PyExc_ValueError, "draw_som: image buffer of %zd bytes is not %dx%dx3", img.len, width,
                     height);
        goto done;
    }
    if (boxes.len % (Py_ssize_t)(5 * sizeof(int64_t)) != 0 || pal.len < 3 || pal.len % 3 != 0 || gh <= 0 ||
        gw <= 0 || gh > 256 || gw > 256 || font.len != 10 * gh * gw || gap < 0 || gap > 256 || pad < 0 ||
        pad > 256 || alpha < 0 || alpha > 256 || outline < 0 || outline > 1024) {
        PyErr_SetString(PyExc_ValueError, "draw_som: bad boxes, palette, font or style arguments");
        goto done;
    }
    {
        const int64_t *bx = (const int64_t *)boxes.buf;
        int64_t n = (int64_t)(boxes.len / (Py_ssize_t)(5 * sizeof(int64_t)));
        const int64_t lim = (int64_t)1 << 31;
        if (((uintptr_t)boxes.buf % _Alignof(int64_t)) != 0) {
            PyErr_SetString(PyExc_ValueError, "draw_som: boxes buffer is not 8-byte aligned");
            goto done;
        }
        for (int64_t i = 0; i < 5 * n; i++)
            if (bx[i] <= -lim || bx[i] >= lim || (i % 5 == 0 && bx[i] < 0)) {
                PyErr_SetString(PyExc_ValueError, "draw_som: box ids must be >= 0 and coordinates < 2**31");
                goto done;
            }
        sty.palette = (const unsigned char *)pal.buf;
        sty.npal = (int64_t)(pal.len / 3);
        sty.font = (const unsigned char *)font.buf;
        sty.gh = gh;
        sty.gw = gw;
        sty.gap = gap;
        sty.pad = pad;
        sty.alpha = alpha;
        sty.outline = outline;
        Py_BEGIN_ALLOW_THREADS
        som_draw((unsigned char *)img.buf, width, height, bx, n, &sty);
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&img);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&pal);
    PyBuffer_Release(&font);
    return ret;
}

/* ------------------------------------------------------------------------- */
/* Module                                                                     */
/* ------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"jpeg_size", (PyCFunction)py_jpeg_size, METH_O, jpeg_size_doc},
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_VARARGS | METH_KEYWORDS, decode_doc},
    {"encode", (PyCFunction)(void (*)(void))py_encode, METH_VARARGS | METH_KEYWORDS, encode_doc},
    {"frame_diff", (PyCFunction)(void (*)(void))py_frame_diff, METH_VARARGS | METH_KEYWORDS, frame_diff_doc},
    {"resize", (PyCFunction)py_resize, METH_VARARGS, resize_doc},
    {"draw_som", (PyCFunction)py_draw_som, METH_VARARGS, draw_som_doc},
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
