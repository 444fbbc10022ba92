/*
 * A libnvidia-ml.so.1 with one GPU and no process: the functions gpumem
 * calls on a plain GPU, nothing more. It is not a fake of NVML for tests
 * of gpumem's logic (those use go-nvml's mocks and the simulated-GPU file):
 * it checks that the wheel's binary, linked by zig with NVML's functions
 * left undefined, loads the library at run time and resolves them in it,
 * on this machine, in an old glibc's chroot and under qemu for arm64.
 * Built with `zig cc -target <arch>-linux-gnu.2.17 -shared`.
 */
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

#define GIB (1ULL << 30)

nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "error from the test's libnvidia-ml"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { strncpy(v, "999.99-test", n); return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) { *h = (void *)(unsigned long)(i + 1); return 0; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *s, unsigned int n) { (void)h; strncpy(s, "GPU-libnvidia-ml-test", n); return 0; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *s, unsigned int n) { (void)h; strncpy(s, "Test NVML GPU", n); return 0; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
	(void)h;
	m->total = 80 * GIB;
	m->used = 7 * GIB;
	m->free = m->total - m->used;
	return 0;
}
static nvmlReturn_t none(unsigned int *n) { *n = 0; return 0; }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_t *p) { (void)h; (void)p; return none(n); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_t *p) { (void)h; (void)p; return none(n); }
