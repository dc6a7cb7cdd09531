#include "cli/device.h"

#include <string.h>

#include "common/util.h"
#ifdef CLLA_HAVE_CUDA
#include "kernels/backend_cuda.h"
#endif

const Backend *device_backend(const char *name) {
    if (!name || !strcmp(name, "cpu")) return backend_cpu();
    // the CPU ops with the CUDA backend's bf16 roundings: a GPU run's prediction on any machine
    if (!strcmp(name, "cpu-bf16")) return backend_cpu_bf16();
    if (!strcmp(name, "cuda")) {
#ifdef CLLA_HAVE_CUDA
        return backend_cuda();
#else
        die("--device cuda: this clla was built without the CUDA backend: rebuild with -DCLLA_CUDA=ON on a machine with nvcc");
#endif
    }
    die("unknown device '%s': use cpu, cpu-bf16 or cuda", name);
}
