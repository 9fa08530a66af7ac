#include "format/dtype.h"

#include <string.h>

static const struct {
    k3c_dtype type;
    const char *name;
    size_t size;
} dtype_table[] = {
    {K3C_DTYPE_BF16, "BF16", 2}, {K3C_DTYPE_F16, "F16", 2}, {K3C_DTYPE_F32, "F32", 4},
    {K3C_DTYPE_U8, "U8", 1},     {K3C_DTYPE_I8, "I8", 1},   {K3C_DTYPE_F8_E4M3, "F8_E4M3", 1},
    {K3C_DTYPE_I32, "I32", 4},   {K3C_DTYPE_I64, "I64", 8}, {K3C_DTYPE_F64, "F64", 8},
};

size_t k3c_dtype_size(k3c_dtype t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].type == t) return dtype_table[i].size;
    return 0;
}

const char *k3c_dtype_name(k3c_dtype t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].type == t) return dtype_table[i].name;
    return "INVALID";
}

k3c_dtype k3c_dtype_parse(const char *s) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, s) == 0) return dtype_table[i].type;
    return K3C_DTYPE_INVALID;
}
