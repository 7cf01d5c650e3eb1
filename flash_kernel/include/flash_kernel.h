/* flash_kernel.h: the C ABI of the sovereign flash-attention library.
 *
 * One header for every target (gfx1030 and other AMD targets through HIP, sm_90/sm_80 through
 * CUDA, and the CPU). Any library that exports these symbols can be audited, checked for parity
 * and timed by sovereign-audit (`--lib PATH`).
 *
 * Computes O = softmax(scale * Q K^T) V, non-causal, per (batch, head), without materialising the
 * Nq x Nk score matrix (fk_flash_forward), or by materialising it (fk_naive_forward: the
 * "pre-flash" oracle path). Accumulation and softmax statistics are fp32 for every input dtype.
 *
 * Tensors are 4-D with logical shape (B, H, N, D). Strides are in ELEMENTS for the B, H and N
 * dimensions; the D dimension must be contiguous (stride 1). (B,H,N,D) and (B,N,H,D) layouts are
 * both expressed through strides. Q and O have N = nq; K and V have N = nk.
 *
 * Pointers are device pointers on GPU targets and host pointers on the CPU target. `stream` is a
 * hipStream_t / cudaStream_t (NULL: the default stream); the CPU target ignores it. Calls are
 * asynchronous on GPU targets: launch errors are reported, kernel faults surface at the next sync.
 *
 * Every function returns FK_OK (0) or an fk_status; fk_last_error() then describes the failure
 * (thread-local, valid until the next call on that thread). No call reads or writes out of bounds
 * for any argument values: bad arguments are rejected before any launch.
 */
#ifndef FLASH_KERNEL_H
#define FLASH_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI 2 added the log-sum-exp output (fk_attention_args.lse, .lse_stride) at the end of the
 * argument struct; ABI 3 the precision and its workspace (.precision, .workspace,
 * .workspace_bytes) after them, and fk_workspace_bytes. A library refuses arguments of any other
 * ABI (FK_ERR_ABI): the struct's size differs. */
#define FK_ABI_VERSION 3

typedef enum fk_dtype {
    FK_DTYPE_F32 = 0,
    FK_DTYPE_F16 = 1,
    FK_DTYPE_BF16 = 2
} fk_dtype;

typedef enum fk_status {
    FK_OK = 0,
    FK_ERR_NULL_POINTER = 1,   /* args, q, k, v or o is NULL (lse may be) */
    FK_ERR_DTYPE = 2,          /* dtype not one of fk_dtype */
    FK_ERR_HEAD_DIM = 3,       /* head_dim not supported by this build (see fk_supported_head_dims) */
    FK_ERR_SIZE = 4,           /* a size <= 0, or sizes/strides whose extents overflow int64 */
    FK_ERR_STRIDE = 5,         /* a negative stride, or a layout the kernels cannot address */
    FK_ERR_ALIGNMENT = 6,      /* a pointer or stride misaligned for the vector path */
    FK_ERR_SCALE = 7,          /* scale negative, NaN or infinite */
    FK_ERR_LAUNCH = 8,         /* the runtime refused the launch (message carries its text) */
    FK_ERR_NO_MEMORY = 9,      /* fk_naive_forward could not allocate its score workspace */
    FK_ERR_ABI = 10,           /* args->abi_version differs from FK_ABI_VERSION */
    FK_ERR_PRECISION = 11,     /* precision not one of fk_precision, or not available on this
                                * target, device or head dim (the message says which) */
    FK_ERR_WORKSPACE = 12      /* workspace NULL, smaller than fk_workspace_bytes, or not 16-byte aligned */
} fk_status;

/* ABI 3. FK_PRECISION_EXACT: the kernel as described above. FK_PRECISION_FP8: quantized attention
 * (flash_kernel/fp8.py's scheme: INT8 Q K^T with K smoothed, e4m3 P V, per-block scales computed
 * inside the call) where the target has FP8 tensor cores (sm_90a builds on a cc 9.0 device, head
 * dims 32..128); inputs and output stay in `dtype`. It needs the workspace fk_workspace_bytes
 * names, on the device, and is then CUDA-graph safe as the exact path is. */
typedef enum fk_precision {
    FK_PRECISION_EXACT = 0,
    FK_PRECISION_FP8 = 1
} fk_precision;

typedef struct fk_attention_args {
    int32_t abi_version;       /* must be FK_ABI_VERSION */
    int32_t dtype;             /* fk_dtype: q, k, v and o share it */
    const void *q;
    const void *k;
    const void *v;
    void *o;
    int64_t batch;             /* B >= 1 */
    int64_t heads;             /* H >= 1 */
    int64_t nq;                /* query tokens >= 1 */
    int64_t nk;                /* key/value tokens >= 1 */
    int64_t head_dim;          /* D */
    int64_t q_stride[3];       /* element strides of Q for B, H, N */
    int64_t k_stride[3];
    int64_t v_stride[3];
    int64_t o_stride[3];
    float scale;               /* 0: default 1/sqrt(D); otherwise > 0 and finite */
    void *stream;              /* hipStream_t / cudaStream_t, or NULL */
    /* ABI 2. The log-sum-exp of each query row's scaled scores, in natural log and fp32:
     * lse[b,h,i] = log(sum_j exp(scale * q_i . k_j)), written at
     * lse + b*lse_stride[0] + h*lse_stride[1] + i*lse_stride[2] (strides in float elements, >= 0,
     * lse_stride[2] >= 1 when nq > 1; lse 4-byte aligned). It is what ring attention merges
     * partial outputs by. NULL: nothing is written, and the kernels skip it at no cost. */
    float *lse;
    int64_t lse_stride[3];
    /* ABI 3. fk_precision; FK_PRECISION_EXACT needs no workspace (NULL, 0). */
    int32_t precision;
    void *workspace;           /* device memory of workspace_bytes >= fk_workspace_bytes(args) */
    int64_t workspace_bytes;
} fk_attention_args;

/* FK_ABI_VERSION of the library: a caller refuses a library whose version differs. */
int32_t fk_abi_version(void);

/* The target the library was built for: "gfx1030", "gfx90a", "sm_90", "sm_80", "cpu", ... */
const char *fk_target(void);

/* The flash path compiled in: "wgmma" (an sm_90a build on a cc 9.0 device), "mma_sync" (NVIDIA
 * tensor cores), "generic" (the tiled FMA path: the RDNA2 kernel; on NVIDIA only when forced with
 * -DFK_FORCE_GENERIC) or "cpu". fp16/bf16 calls take it at every supported head dim; fp32 calls on
 * NVIDIA take "generic". */
const char *fk_flash_path(void);

/* Head dims this build supports, written into dims[0..n); returns how many there are (call with
 * dims NULL to count). Every target: 32 to 256 in steps of 8. */
int32_t fk_supported_head_dims(int32_t *dims, int32_t capacity);

/* The message of the last failed call on this thread ("" if none). */
const char *fk_last_error(void);

/* The flash path the last fk_flash_forward on this thread ran: "wgmma", "mma_sync", "generic" or
 * "cpu"; "" when that call was refused or failed (or none was made). Dispatch picks the path per
 * call (device, dtype, head dim, tensor layout), so fk_flash_path() alone cannot say which ran.
 * Added within ABI 1: a caller that finds no such symbol treats the path as unknown. */
const char *fk_last_flash_path(void);

/* The workspace fk_flash_forward needs for these arguments (their sizes, head dim and precision),
 * in bytes, into *bytes: 0 for FK_PRECISION_EXACT. Refuses what fk_flash_forward would refuse for
 * its arguments alone (FK_ERR_PRECISION where this build has no such kernel); needs no device.
 * Optional: a library that does not export it has no path that needs a workspace (no FP8). */
int32_t fk_workspace_bytes(const fk_attention_args *args, int64_t *bytes);

/* Flash forward: tiled online softmax, never materialising Nq x Nk. CUDA-graph safe (no
 * allocation, no synchronisation). Writes O, and the log-sum-exp where args->lse is non-NULL. */
int32_t fk_flash_forward(const fk_attention_args *args);

/* Naive (pre-flash) forward: S = scale * Q K^T into an fp32 workspace it allocates per head
 * group, row softmax, then S V. The oracle the seed measured against. Not graph safe. Writes the
 * log-sum-exp too where args->lse is non-NULL. */
int32_t fk_naive_forward(const fk_attention_args *args);  /* FK_PRECISION_EXACT only: the oracle */

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KERNEL_H */
