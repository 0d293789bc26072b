/* module.c: the Python module llminfer._cuda (or llminfer._hip) around the
 * GPU backend of backend.cu. It only answers questions and hands out the
 * backend's function table in a capsule; llminfer._core takes the capsule
 * and calls the table (backend.h), so the two modules share no symbols and
 * the CPU module never links a GPU runtime.
 *
 *   probe()    -> (code, message, device_count); code 0 ok, 1 no driver,
 *                 2 no device, 3 another error
 *   devices()  -> [(name, total_bytes, (major, minor)), ...]
 *   backend()  -> capsule "llminfer.li_backend_ops"
 *   runtime_version() -> int (CUDA: 1000 * major + 10 * minor)
 *   NAME       -> "cuda" or "hip"
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../backend.h"

#ifndef LLMINFER_GPU_MODULE
#define LLMINFER_GPU_MODULE _cuda
#endif
#define LI_STR2(x) #x
#define LI_STR(x) LI_STR2(x)
#define LI_CAT2(a, b) a##b
#define LI_CAT(a, b) LI_CAT2(a, b)

const li_backend_ops *li_gpu_backend_ops(void);
int li_gpu_probe(int *count, char *msg, size_t size);
int li_gpu_device_info(int device, char *name, size_t size, size_t *total_mem, int *major, int *minor);
int li_gpu_runtime_version(void);

static PyObject *probe(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    char msg[300] = "";
    int count = 0, code;
    Py_BEGIN_ALLOW_THREADS code = li_gpu_probe(&count, msg, sizeof(msg));
    Py_END_ALLOW_THREADS return Py_BuildValue("(isi)", code, msg, count);
}

static PyObject *devices(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    char msg[300];
    int count = 0;
    PyObject *out = PyList_New(0);
    if (!out || li_gpu_probe(&count, msg, sizeof(msg)) != 0) return out;
    for (int i = 0; i < count; i++) {
        char name[256] = "";
        size_t mem = 0;
        int major = 0, minor = 0;
        if (li_gpu_device_info(i, name, sizeof(name), &mem, &major, &minor) != 0) continue;
        PyObject *d = Py_BuildValue("(sn(ii))", name, (Py_ssize_t)mem, major, minor);
        if (!d || PyList_Append(out, d) != 0) {
            Py_XDECREF(d);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(d);
    }
    return out;
}

static PyObject *backend(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyCapsule_New((void *)li_gpu_backend_ops(), LI_BACKEND_CAPSULE, NULL);
}

static PyObject *runtime_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(li_gpu_runtime_version());
}

static PyMethodDef methods[] = {
    {"probe", probe, METH_NOARGS, "(code, message, device_count): 0 ok, 1 no driver, 2 no device, 3 other"},
    {"devices", devices, METH_NOARGS, "[(name, total_bytes, (major, minor))] of the devices present"},
    {"backend", backend, METH_NOARGS, "the backend's function table, as a capsule for llminfer._core"},
    {"runtime_version", runtime_version, METH_NOARGS, "the GPU runtime's version number"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "llminfer." LI_STR(LLMINFER_GPU_MODULE),
                                    "llminfer's GPU layer backend", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC LI_CAT(PyInit_, LLMINFER_GPU_MODULE)(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "NAME", li_gpu_backend_ops()->name) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
