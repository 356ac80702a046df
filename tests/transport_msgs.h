/* The messages the transport conformance suite (tests/test_transport.c)
 * sends over every transport: message k's header, and its payload pattern,
 * so any end can check what arrived without the sender. */
#ifndef MMP_TESTS_TRANSPORT_MSGS_H
#define MMP_TESTS_TRANSPORT_MSGS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "transport/channel.h"

static inline mmp_msg_header message(int k, size_t slot_bytes)
{
    mmp_msg_header h = {.step = k / 4,
                        .mb = k % 4,
                        .digest = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1),
                        .bytes = slot_bytes ? 1 + ((uint64_t)k * 7919u) % slot_bytes : 0,
                        .n = k % 17 + 1,
                        .flags =
                            (k % 5 == 0 ? MMP_MSG_EVAL : 0) | (k % 3 == 0 ? MMP_MSG_ALL_VALID : 0)};
    return h;
}

/* Message k's payload pattern over n bytes. */
static inline void fill(unsigned char *p, size_t n, uint64_t k)
{
    size_t w = n / 8;
    for (size_t j = 0; j < w; j++) {
        uint64_t v = k * 0x9E3779B97F4A7C15ull + j;
        memcpy(p + 8 * j, &v, 8);
    }
    for (size_t i = w * 8; i < n; i++) {
        p[i] = (unsigned char)(k * 31 + i);
    }
}

/* Index of the first byte that differs from fill(.., k), or n. */
static inline size_t first_bad(const unsigned char *p, size_t n, uint64_t k)
{
    size_t w = n / 8;
    for (size_t j = 0; j < w; j++) {
        uint64_t v = k * 0x9E3779B97F4A7C15ull + j, got;
        memcpy(&got, p + 8 * j, 8);
        if (got != v) {
            return 8 * j;
        }
    }
    for (size_t i = w * 8; i < n; i++) {
        if (p[i] != (unsigned char)(k * 31 + i)) {
            return i;
        }
    }
    return n;
}

static inline int same_header(const mmp_msg_header *a, const mmp_msg_header *b)
{
    return a->step == b->step && a->mb == b->mb && a->digest == b->digest && a->bytes == b->bytes &&
           a->n == b->n && a->flags == b->flags;
}

#endif
