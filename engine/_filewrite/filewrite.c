/*
 * engine._filewrite._core -- write a batch of files with the GIL released once for the whole batch.
 *
 *   write_files(items) -> list[int]
 *       items: a sequence of (path, data, make_dir): path a str or bytes file system path, data any
 *       C-contiguous buffer (bytes, memoryview over shared memory, ...), make_dir true to create the
 *       file's folder (and its parents) first. Returns one errno per item, 0 for a file written whole.
 *
 * Why: Python's os.open / os.write / os.close each release and take back the GIL. A writer thread that
 * makes three such calls per file has to win the GIL three times per file from an event loop that
 * rarely gives it up, and falls seconds behind. Here the GIL is taken back once per batch.
 *
 * Every buffer is held (PyObject_GetBuffer) from before the GIL is released until after it is taken
 * back, so a caller may pass views it frees right after the call returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject *path;  /* bytes, from PyUnicode_FSConverter */
    Py_buffer data;
    int have_data;
    int make_dir;
    int err;
} job_t;

/* mkdir -p of the folder that holds `path` (mode 0777 before the umask, as os.makedirs). */
static int make_parents(const char *path)
{
    size_t n = strlen(path);
    char *buf = malloc(n + 1);
    if (!buf)
        return ENOMEM;
    memcpy(buf, path, n + 1);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) {
        free(buf);
        return 0;
    }
    *slash = '\0';
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                int err = errno;
                free(buf);
                return err;
            }
            if (saved == '\0')
                break;
            *p = saved;
        }
    }
    free(buf);
    return 0;
}

static int write_one(const char *path, const char *data, Py_ssize_t len, int make_dir)
{
    if (make_dir) {
        int err = make_parents(path);
        if (err)
            return err;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    int err = 0;
    while (len > 0) {
        ssize_t w = write(fd, data, (size_t)len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        data += w;
        len -= w;
    }
    if (close(fd) != 0 && !err && errno != EINTR)
        err = errno;
    return err;
}

static void release_jobs(job_t *jobs, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (jobs[i].have_data)
            PyBuffer_Release(&jobs[i].data);
        Py_XDECREF(jobs[i].path);
    }
    PyMem_Free(jobs);
}

PyDoc_STRVAR(write_files_doc,
"write_files(items) -> list[int]\n\n"
"Write each (path, data, make_dir) of ``items`` as a whole file (created or truncated, mode 0644;\n"
"``make_dir``: its folder and parents created first), in order, with the GIL released for the whole\n"
"batch. One errno per item: 0 when the file was written whole.");

static PyObject *py_write_files(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "write_files() takes a sequence of (path, data, make_dir)");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    job_t *jobs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *jobs);
    if (!jobs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *path_obj, *data_obj, *make_dir_obj;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_Format(PyExc_TypeError, "item %zd is not a (path, data, make_dir) tuple", i);
            goto fail;
        }
        path_obj = PyTuple_GET_ITEM(item, 0);
        data_obj = PyTuple_GET_ITEM(item, 1);
        make_dir_obj = PyTuple_GET_ITEM(item, 2);
        if (!PyUnicode_FSConverter(path_obj, &jobs[i].path))
            goto fail;
        if (PyObject_GetBuffer(data_obj, &jobs[i].data, PyBUF_SIMPLE) < 0)
            goto fail;
        jobs[i].have_data = 1;
        int make_dir = PyObject_IsTrue(make_dir_obj);
        if (make_dir < 0)
            goto fail;
        jobs[i].make_dir = make_dir;
    }

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        jobs[i].err = write_one(PyBytes_AS_STRING(jobs[i].path), jobs[i].data.buf, jobs[i].data.len,
                                jobs[i].make_dir);
    Py_END_ALLOW_THREADS

    PyObject *out = PyList_New(n);
    if (!out)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *code = PyLong_FromLong(jobs[i].err);
        if (!code) {
            Py_DECREF(out);
            goto fail;
        }
        PyList_SET_ITEM(out, i, code);
    }
    release_jobs(jobs, n);
    Py_DECREF(seq);
    return out;

fail:
    release_jobs(jobs, n);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"write_files", (PyCFunction)py_write_files, METH_O, write_files_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_core",
    "Write a batch of files with the GIL released once for the whole batch.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModule_Create(&moduledef);
}
