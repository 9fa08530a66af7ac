/* Standard base64 (RFC 4648 alphabet, '=' padding), the token encoding of tiktoken.model files. */
#ifndef K3C_TEXT_BASE64_H
#define K3C_TEXT_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Decodes s[0 .. n) into out (room for n / 4 * 3 bytes); the decoded length, or -1 when s is not
 * canonical padded base64 (a length that is not a multiple of 4, a byte outside the alphabet, padding
 * anywhere but the end). */
long k3c_base64_decode(const char *s, size_t n, uint8_t *out);

/* Encodes s[0 .. n) into out (room for (n + 2) / 3 * 4 bytes, no NUL); returns the length written. */
size_t k3c_base64_encode(const uint8_t *s, size_t n, char *out);

#endif
