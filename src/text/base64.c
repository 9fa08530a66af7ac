#include "text/base64.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

long k3c_base64_decode(const char *s, size_t n, uint8_t *out) {
    if (n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = 0;
        if (i + 4 == n) pad = (s[n - 1] == '=') + (s[n - 1] == '=' && s[n - 2] == '=');
        int v[4] = {0, 0, 0, 0};
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = value((unsigned char)s[i + k])) < 0) return -1;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

size_t k3c_base64_encode(const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16;
        if (i + 1 < n) w |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n) w |= s[i + 2];
        out[o++] = alphabet[w >> 18 & 63];
        out[o++] = alphabet[w >> 12 & 63];
        out[o++] = i + 1 < n ? alphabet[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? alphabet[w & 63] : '=';
    }
    return o;
}
