/* A stand-in for nccl.h, for tests/nccl_mock only (see mock.c): an R-rank
 * "communicator" (R <= 8) is a star of unix stream sockets to rank 0, found
 * through an abstract socket name carried in the ncclUniqueId; non-blocking
 * as NCCL's with blocking = 0 (init, send, recv and all-gather return
 * ncclInProgress and settle under ncclCommGetAsyncError). Send and recv
 * need R = 2. */
#ifndef MMP_NCCL_MOCK_NCCL_H
#define MMP_NCCL_MOCK_NCCL_H
#include <stddef.h>
#include "cuda_runtime_api.h"

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct mock_comm *ncclComm_t;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclUint8 = 1, ncclDouble = 8 } ncclDataType_t;
typedef struct {
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        1                                                                                          \
    }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t comm);
#endif
