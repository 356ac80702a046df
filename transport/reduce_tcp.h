/* The replica reduce over TCP (transport/reduce_tcp.c): what
 * transport/reduce.c hands a cfg whose name is "host:port" instead of a POSIX
 * shm name. Internal to transport/; the contract is reduce.h's. */
#ifndef MMP_TRANSPORT_REDUCE_TCP_H
#define MMP_TRANSPORT_REDUCE_TCP_H

#include <stddef.h>

#include "common/err.h"
#include "transport/reduce.h"

typedef struct mmp_reduce_tcp mmp_reduce_tcp;

/* Rank 0 listens (and returns at once), rank k > 0 connects and is checked
 * by rank 0 (replicas, capacity, rank free) before this returns. R >= 2. */
mmp_err mmp_reduce_tcp_open(mmp_reduce_tcp **out, const mmp_reduce_cfg *cfg);
/* One sum of n elements of size bytes (4 or 8) at v, already checked
 * against the capacity by the caller. */
mmp_err mmp_reduce_tcp_round(mmp_reduce_tcp *r, void *v, size_t n, size_t size);
/* Rank 0: "host:port" it listens on; others: rank 0's address. */
const char *mmp_reduce_tcp_address(const mmp_reduce_tcp *r);
/* NULL-safe. Peers blocked in a sum see the connection end at once. */
void mmp_reduce_tcp_close(mmp_reduce_tcp *r);

#endif
