/* Device measurements a benchmark states its floor against (include/k3c.h k3c_device_copy_bandwidth,
 * k3c_device_download_seconds). */
#ifndef K3C_CUDA_MEASURE_H
#define K3C_CUDA_MEASURE_H

#include <stddef.h>

/* Read + write bytes per second of a 1 GiB device-to-device copy, best of 5 (CUDA events). */
int k3c_cuda_copy_bandwidth(double *bytes_per_s);
/* Median of 5 device -> host copies of `bytes` into page-locked (pageable 0) or malloc'ed memory. */
int k3c_cuda_download_seconds(size_t bytes, int pageable, double *seconds);

#endif
