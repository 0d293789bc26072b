/* gpu_compat.h: the one place that knows whether the GPU sources are built
 * by nvcc (CUDA) or hipcc (HIP, with LLMINFER_HIP defined). The .cu files use
 * the CUDA runtime's names; under HIP this header maps each one they use to
 * HIP's. Shuffles go through li_shfl_xor with a width of 32 lanes, so a
 * "warp" is 32 threads on every target (an AMD wave of 64 holds two).
 */
#ifndef LLMINFER_GPU_COMPAT_H
#define LLMINFER_GPU_COMPAT_H

#if defined(LLMINFER_HIP)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define LI_GPU_NAME "hip"
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaMemGetInfo hipMemGetInfo
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define li_shfl_xor(v, o) __shfl_xor((v), (o), 32)

#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define LI_GPU_NAME "cuda"
#define li_shfl_xor(v, o) __shfl_xor_sync(0xffffffffu, (v), (o), 32)
#endif

/* f16 bits <-> float on the device (the KV cache holds raw f16 bits) */
static __device__ __forceinline__ float li_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t li_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

#endif
