/* The kernels' shared memory limits, raised once per device before any step runs.
 *
 * A kernel that takes more than 48 KB of dynamic shared memory needs its limit raised
 * (cudaFuncSetAttribute) before it launches. That call is not free of the device's progress: it has been
 * reported to wait for the context's pending host-device copies (intel/llvm #16928). With several ranks on
 * one GPU, a copy queued behind a rank's spinning mailbox kernel would then hold a peer inside that call,
 * the peer the spinning kernel waits for (comm/mailbox_cuda.c, "the launch rendezvous", is the general
 * answer; this takes k3c's own such calls out of the steps, and a step no longer pays for them).
 * So every limit is raised here, once per device, when the backend is made (k3c_backend_cuda_create); the
 * launchers call k3c_cuda_kernels_prepare too, which returns at once after the first time, so a kernel test
 * that launches without a backend still finds its limits set. */
#ifndef K3C_CUDA_KERNEL_LIMITS_H
#define K3C_CUDA_KERNEL_LIMITS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Raises every kernel's dynamic shared memory limit on the current device, the first time for that device
 * (thread-safe; later calls only read a flag). K3C_OK or K3C_ERR with the failing kernel named. */
int k3c_cuda_kernels_prepare(void);

/* Each file's part, called by k3c_cuda_kernels_prepare on the current device (their .cu files). */
int k3c_cuda_kda_limits(void);
int k3c_cuda_mla_limits(void);
int k3c_cuda_mla_expanded_limits(void);
int k3c_cuda_moe_limits(void);
int k3c_cuda_moe_pair_limits(void);

#ifdef __cplusplus
}
#endif

#endif
