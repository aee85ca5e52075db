// <cuda.h> for the CUDA emulator (tests/cuda_emulator): the driver types csrc/cuda/check.cuh names.
#pragma once

typedef int CUresult;
typedef int CUdevice;
#define CUDA_SUCCESS 0
