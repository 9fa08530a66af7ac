/* Element types that appear in safetensors files k3c reads. */
#ifndef K3C_FORMAT_DTYPE_H
#define K3C_FORMAT_DTYPE_H

#include <stddef.h>

typedef enum k3c_dtype {
    K3C_DTYPE_INVALID = 0,
    K3C_DTYPE_BF16,
    K3C_DTYPE_F16,
    K3C_DTYPE_F32,
    K3C_DTYPE_U8,
    K3C_DTYPE_I8,
    K3C_DTYPE_F8_E4M3,
    K3C_DTYPE_I32,
    K3C_DTYPE_I64,
    K3C_DTYPE_F64,
} k3c_dtype;

/* Bytes per element; 0 for K3C_DTYPE_INVALID. */
size_t k3c_dtype_size(k3c_dtype t);
/* The safetensors spelling ("BF16", "F32", ...). */
const char *k3c_dtype_name(k3c_dtype t);
/* Parses a safetensors dtype string; K3C_DTYPE_INVALID when unknown. */
k3c_dtype k3c_dtype_parse(const char *s);

#endif
