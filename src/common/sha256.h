/* sha256 — SHA-256 (FIPS 180-4), for content hashes other programs recompute (vLLM's
 * prefix-cache block hashes, sha256_cbor). Not for secrets: no constant-time claims.
 * Pure, thread-safe (caller-owned state). */
#ifndef MOTOR_SHA256_H
#define MOTOR_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

struct sha256 {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
    size_t buf_len;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t n);
void sha256_final(struct sha256 *s, uint8_t out[SHA256_LEN]);
/* One shot. */
void sha256(const void *data, size_t n, uint8_t out[SHA256_LEN]);

#endif
