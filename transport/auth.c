/* The job-key handshake (transport/auth.h): HMAC-SHA256 challenge and
 * response with libsodium's primitives (randombytes_buf, crypto_auth_
 * hmacsha256, sodium_memcmp), never a home-made one. */
#include "transport/auth.h"

#include <sodium.h>
#include <string.h>

#include "transport/sock.h"

#define AUTH_MAGIC "MMPAUTH1"
#define NONCE 32

static const char ROLE_CONNECTOR[] = "mmpipe connector";
static const char ROLE_LISTENER[] = "mmpipe listener";

/* HMAC-SHA256(secret, role || a || b) into mac. */
static void mac_of(unsigned char mac[crypto_auth_hmacsha256_BYTES], const char *secret,
                   const char *role, const unsigned char a[NONCE], const unsigned char b[NONCE])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)secret, strlen(secret));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)role, strlen(role) + 1);
    crypto_auth_hmacsha256_update(&st, a, NONCE);
    crypto_auth_hmacsha256_update(&st, b, NONCE);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

mmp_err mmp_auth_handshake(int fd, const char *what, const char *secret, int connector,
                           double deadline, int stop_fd)
{
    if (!secret || !secret[0]) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: no job secret to authenticate the connection",
                          what);
    }
    if (sodium_init() < 0) {
        return mmp_errorf(MMP_ERR_INTERNAL, "%s: libsodium failed to initialise", what);
    }
    unsigned char mine[8 + NONCE], theirs[8 + NONCE];
    memcpy(mine, AUTH_MAGIC, 8);
    randombytes_buf(mine + 8, NONCE);
    struct iovec iov = {mine, sizeof mine};
    MMP_TRY(mmp_sock_writev(fd, what, &iov, 1, deadline, stop_fd));
    MMP_TRY(mmp_sock_read(fd, what, theirs, sizeof theirs, deadline, stop_fd, NULL));
    if (memcmp(theirs, AUTH_MAGIC, 8) != 0) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s: not an mmpipe peer (its first bytes are not the job-key handshake)",
                          what);
    }
    if (sodium_memcmp(theirs + 8, mine + 8, NONCE) == 0) {
        return mmp_errorf(MMP_ERR_PROTO, "%s: the peer sent this end's own nonce back", what);
    }
    unsigned char my_mac[crypto_auth_hmacsha256_BYTES], want[crypto_auth_hmacsha256_BYTES],
        got[crypto_auth_hmacsha256_BYTES];
    mac_of(my_mac, secret, connector ? ROLE_CONNECTOR : ROLE_LISTENER, mine + 8, theirs + 8);
    mac_of(want, secret, connector ? ROLE_LISTENER : ROLE_CONNECTOR, theirs + 8, mine + 8);
    iov = (struct iovec){my_mac, sizeof my_mac};
    mmp_err e = mmp_sock_writev(fd, what, &iov, 1, deadline, stop_fd);
    if (e == MMP_OK) {
        e = mmp_sock_read(fd, what, got, sizeof got, deadline, stop_fd, NULL);
    }
    if (e == MMP_OK && sodium_memcmp(got, want, sizeof want) != 0) {
        e = mmp_errorf(MMP_ERR_PROTO,
                       "%s: the peer does not hold this job's key (its HMAC of the nonces is "
                       "wrong): a process of another job, or of none",
                       what);
    }
    sodium_memzero(want, sizeof want);
    return e;
}
