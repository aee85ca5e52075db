// <cuda_runtime.h> for running csrc/cuda on the CPU (tests/cuda_emulator): the kernels are
// compiled as ordinary C++ and every thread of a block runs as a coroutine (tests/lanes), so
// __syncthreads and the warp functions really synchronize; threadIdx and its kin are globals the
// scheduler sets as it switches threads. `__shared__` variables become function statics shared
// by the coroutines of the one block that runs at a time; atomics are plain read-modify-writes
// (one thread runs at a time, and switches only at a barrier or a warp function); fences do
// nothing. Device intrinsics whose GPU result is an approximation (__expf, rsqrtf) are exact
// here. The host API is the subset the backend calls (below). The kernel files compile with
// -fno-strict-aliasing, as nvcc treats their reinterpret_casts. A file that needs more fails to
// compile here, which is the cue to add it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "lanes.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) int2 {
    int x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }

// The running thread's indices: set by the scheduler each time it switches to a thread.
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace er_cuda_emulator {
inline void on_switch(uint32_t thread, const uint32_t group[3], const uint32_t groups[3], uint32_t threads) {
    threadIdx = uint3{thread, 0, 0};
    blockIdx = uint3{group[0], group[1], group[2]};
    gridDim = dim3(groups[0], groups[1], groups[2]);
    blockDim = dim3(threads);
}

template <typename T>
uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "a warp function's value is at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
T of_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
}  // namespace er_cuda_emulator

inline void __syncthreads() { er_emulator::threadgroup_barrier(); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { er_emulator::simdgroup_barrier(); }
// (the block's one running thread at a time: a total reset, then every thread's predicate added, then read)
inline int __syncthreads_count(int predicate) {
    static int total;
    __syncthreads();
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    total += predicate != 0;
    __syncthreads();
    return total;
}
inline void __threadfence() {}
inline void __threadfence_system() {}

// Warp functions (one block's warps are its 32-lane SIMD groups; the mask is taken as full, but by
// __reduce_add_sync).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    return er_cuda_emulator::of_bits<T>(er_emulator::simd_exchange(er_cuda_emulator::bits_of(v), er_emulator::kXor, static_cast<uint32_t>(lane_mask)));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
    return er_cuda_emulator::of_bits<T>(er_emulator::simd_exchange(er_cuda_emulator::bits_of(v), er_emulator::kDown, delta));
}
template <typename T>
T __shfl_sync(unsigned, T v, int src_lane) {
    return er_cuda_emulator::of_bits<T>(er_emulator::simd_exchange(er_cuda_emulator::bits_of(v), er_emulator::kBroadcast, static_cast<uint32_t>(src_lane) % 32));
}
[[noreturn]] inline void __trap() { std::abort(); }
inline unsigned __ballot_sync(unsigned, int predicate) {
    return static_cast<unsigned>(er_emulator::simd_exchange(predicate != 0, er_emulator::kBallot, 0));
}
inline unsigned __match_any_sync(unsigned, unsigned v) { return static_cast<unsigned>(er_emulator::simd_exchange(v, er_emulator::kMatchAny, 0)); }
// (the one warp function whose mask is used: the sum is over the lanes it names)
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) { return static_cast<unsigned>(er_emulator::simd_exchange(v, er_emulator::kSumIn, mask)); }

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __float_as_int(float f) { return er_cuda_emulator::of_bits<int>(er_cuda_emulator::bits_of(f)); }
inline float __int_as_float(int i) { return er_cuda_emulator::of_bits<float>(static_cast<uint32_t>(i)); }
inline unsigned __float_as_uint(float f) { return er_cuda_emulator::of_bits<unsigned>(er_cuda_emulator::bits_of(f)); }
inline float __uint_as_float(unsigned u) { return er_cuda_emulator::of_bits<float>(u); }
inline long long __double_as_longlong(double d) { return er_cuda_emulator::of_bits<long long>(er_cuda_emulator::bits_of(d)); }
inline double __longlong_as_double(long long x) { return er_cuda_emulator::of_bits<double>(static_cast<uint64_t>(x)); }
// (the host compiles these with -ffp-contract=off: each rounds once, as the intrinsics do)
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __float2int_rn(float f) { return static_cast<int>(std::nearbyint(f)); }  // (the default rounding: to nearest even)
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // (the GPU's is an approximation)
inline float __expf(float x) { return std::exp(x); }  // (the GPU's is an approximation: results differ in the last bits)
template <typename T>
T __ldcg(const T* p) {
    return *p;
}
template <typename T>
T __ldcs(const T* p) {
    return *p;
}
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }

// Byte and integer SIMD intrinsics
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(a >> 8 * i) * static_cast<int8_t>(b >> 8 * i);
    return c;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = static_cast<uint64_t>(y) << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>(v >> 8 * (s >> 4 * i & 7) & 0xFF) << 8 * i;
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return static_cast<unsigned>((static_cast<uint64_t>(hi) << 32 | lo) >> (shift & 31));
}
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((a >> 8 * i) - (b >> 8 * i) & 0xFFu) << 8 * i;
    return r;
}

// Atomics: *p = f(*p), the old value back (no other thread runs in between here).
template <typename T, typename F>
T atomic_update(T* p, F f) {
    const T old = *p;
    *p = f(old);
    return old;
}
template <typename T>
T atomicAdd(T* p, T v) { return atomic_update(p, [v](T o) { return o + v; }); }
template <typename T>
T atomicExch(T* p, T v) { return atomic_update(p, [v](T) { return v; }); }
template <typename T>
T atomicMax(T* p, T v) { return atomic_update(p, [v](T o) { return std::max(o, v); }); }
template <typename T>
T atomicMin(T* p, T v) { return atomic_update(p, [v](T o) { return std::min(o, v); }); }

namespace er_cuda_emulator {
// A device instruction the emulator has no stand-in for was reached: the run stops, saying which.
[[noreturn]] inline void not_emulated(const char* what) {
    std::fprintf(stderr, "CUDA emulator: %s is not emulated (prefill chunks of 16 tokens or more take tensor cores)\n", what);
    std::abort();
}
}  // namespace er_cuda_emulator

// CUDA's global min and max (a kernel's unqualified calls)
using std::max;
using std::min;

// ---- host API stand-ins --------------------------------------------------------------------
// A device of compute capability 8.0 (no Hopper-only paths, no programmatic dependent launch)
// with an H200's SM count and an A100's shared memory. Device memory is host memory. Every stream
// operation runs when it is enqueued (one valid order of a stream's work), except while a stream
// is captured into a graph: then it is recorded, and cudaGraphLaunch runs the record (kernel
// arguments copied at capture, copies reading their source when they run, as CUDA graphs do).
// Events and synchronization are no-ops.
#define CUDART_VERSION 12080  // (what the emulator reports as its runtime)
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotSupported = 801,
};
typedef cudaError_t cudaError;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
enum { cudaEnableDefault = 0, cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaDevAttrMaxAccessPolicyWindowSize = 109,
};
enum cudaAccessProperty { cudaAccessPropertyNormal = 0, cudaAccessPropertyStreaming = 1, cudaAccessPropertyPersisting = 2 };
enum cudaLaunchAttributeID { cudaLaunchAttributeAccessPolicyWindow = 1, cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
struct cudaAccessPolicyWindow {
    void* base_ptr;
    size_t num_bytes;
    float hitRatio;
    cudaAccessProperty hitProp, missProp;
};
union cudaLaunchAttributeValue {
    int programmaticStreamSerializationAllowed;
    cudaAccessPolicyWindow accessPolicyWindow;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute* attrs;
    unsigned numAttrs;
};
struct cudaDeviceProp {
    char name[256] = "CUDA emulator (CPU)";
    size_t totalGlobalMem = size_t{16} << 30;
    int multiProcessorCount = 132, major = 8, minor = 0;
};
struct cudaFuncAttributes {
    size_t sharedSizeBytes = 0;
};

namespace er_cuda_emulator {
constexpr size_t kSmemPerBlock = 163 * 1024;  // (an A100's opt-in limit; the emulator's dynamic arrays are this big)
// SMs: an H200's 132, so that the runner's decisions that depend on them (which norms the GEMVs
// write, grid sizes) are the measured device's; EDGERUNNER_CUDA_EMULATOR_SMS=N for another count.
inline int sm_count() {
    static const int n = [] {
        const char* e = std::getenv("EDGERUNNER_CUDA_EMULATOR_SMS");
        return e && std::atoi(e) > 0 ? std::atoi(e) : 132;
    }();
    return n;
}

// The launch's dynamic shared memory (what `extern __shared__ T name[];` names on the GPU: the
// emulator's build turns each such declaration into a call of this, tests/cpp/CMakeLists.txt).
inline unsigned char* dynamic_smem_bytes() {
    alignas(16) static unsigned char memory[kSmemPerBlock];
    return memory;
}
template <typename T>
T* dynamic_smem() {
    return reinterpret_cast<T*>(dynamic_smem_bytes());
}

// Devices: EDGERUNNER_CUDA_EMULATOR_DEVICES of them (1 unless set), each thread's current one
// as the runtime keeps it. Allocations are counted on the device current when they are made,
// launches and copies on the device current when they are enqueued (use), and a kernel or graph
// launched into a stream of another device than the current one is refused, as CUDA refuses it
// (copies are not: CUDA runs them): what a model on cuda:N does can be checked without N GPUs.
inline int device_count() {
    static const int n = [] {
        const char* e = std::getenv("EDGERUNNER_CUDA_EMULATOR_DEVICES");
        return e && std::atoi(e) > 0 ? std::min(std::atoi(e), 8) : 1;
    }();
    return n;
}
inline int& current() {
    thread_local int d = 0;
    return d;
}
struct DeviceUse {
    size_t bytes = 0;       // allocated now
    uint64_t launches = 0;  // kernels and copies run or captured
};
inline DeviceUse& use(int device) {
    static DeviceUse u[8];
    return u[device];
}
inline std::map<const void*, std::pair<int, size_t>>& allocations() {
    static std::map<const void*, std::pair<int, size_t>> m;
    return m;
}
inline std::mutex& lock() {  // one thread at a time in the emulator (the scheduler and threadIdx are global)
    static std::mutex m;
    return m;
}
struct Stream {
    int device;
};

// The entry points launch.cuh hands out, with the bytes of what their parameter points at.
inline std::map<const void*, size_t>& entries() {
    static std::map<const void*, size_t> m;
    return m;
}
inline const void* entry(void (*fn)(const void*), size_t arg_bytes) {
    const void* p = reinterpret_cast<const void*>(fn);
    entries()[p] = arg_bytes;
    return p;
}

struct Op {
    const void* fn = nullptr;  // a kernel (else a copy)
    std::vector<unsigned char> args;
    unsigned grid[3] = {1, 1, 1}, threads = 0;
    void* to = nullptr;
    const void* from = nullptr;
    size_t bytes = 0;
};
inline void invoke(const void* args, const void* fn, uint32_t, uint32_t, uint32_t, uint32_t) {
    reinterpret_cast<void (*)(const void*)>(const_cast<void*>(fn))(args);
}
inline void run(const Op& op) {
    const std::lock_guard<std::mutex> hold(lock());
    if (!op.fn) {
        std::memmove(op.to, op.from, op.bytes);
        return;
    }
    er_emulator::set_switch_hook(on_switch);
    er_emulator::run_grid(invoke, op.args.data(), op.fn, op.grid, op.threads);
}
struct Graph {
    std::vector<Op> ops;
};
// A kernel launched with <<<grid, threads>>> (which C++ does not parse): f runs as each thread.
template <class F>
void launch_plain(unsigned grid, unsigned threads, F f) {
    const uint32_t groups[3] = {grid, 1, 1};
    const std::lock_guard<std::mutex> hold(lock());
    ++use(current()).launches;
    er_emulator::set_switch_hook(on_switch);
    er_emulator::run_grid([](const void* fn, const void*, uint32_t, uint32_t, uint32_t, uint32_t) { (*static_cast<const F*>(fn))(); }, &f,
                          nullptr, groups, threads);
}
inline Graph*& capturing() {  // the graph being captured, or null
    static Graph* g = nullptr;
    return g;
}
// Whether `stream` (null: the current device's default stream) belongs to the current device.
inline bool on_current(cudaStream_t stream) { return !stream || reinterpret_cast<Stream*>(stream)->device == current(); }
inline cudaError_t submit(Op op, cudaStream_t stream) {
    if (op.fn && !on_current(stream)) return cudaErrorInvalidResourceHandle;
    ++use(current()).launches;
    if (capturing()) capturing()->ops.push_back(std::move(op));
    else run(op);
    return cudaSuccess;
}
}  // namespace er_cuda_emulator

inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "not supported by the emulator"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* n) { return *n = er_cuda_emulator::device_count(), cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) { return *d = er_cuda_emulator::current(), cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= er_cuda_emulator::device_count()) return cudaErrorInvalidDevice;
    return er_cuda_emulator::current() = d, cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d < 0 || d >= er_cuda_emulator::device_count()) return cudaErrorInvalidDevice;
    return *p = cudaDeviceProp{}, cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
    switch (a) {
        case cudaDevAttrMultiProcessorCount: *v = er_cuda_emulator::sm_count(); break;
        case cudaDevAttrComputeCapabilityMajor: *v = 8; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(er_cuda_emulator::kSmemPerBlock); break;
        case cudaDevAttrMaxAccessPolicyWindowSize: *v = 0; break;
    }
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    *total = cudaDeviceProp{}.totalGlobalMem;
    *free = *total - std::min(*total, er_cuda_emulator::use(er_cuda_emulator::current()).bytes);
    return cudaSuccess;
}
// (64 bytes of slack: staged copies round a row's ends out to 16-byte boundaries)
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (!(*p = std::calloc(1, bytes + 64))) return cudaErrorMemoryAllocation;
    const std::lock_guard<std::mutex> hold(er_cuda_emulator::lock());
    er_cuda_emulator::allocations()[*p] = {er_cuda_emulator::current(), bytes};
    er_cuda_emulator::use(er_cuda_emulator::current()).bytes += bytes;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    {
        const std::lock_guard<std::mutex> hold(er_cuda_emulator::lock());
        const auto it = er_cuda_emulator::allocations().find(p);
        if (it == er_cuda_emulator::allocations().end()) return cudaErrorInvalidValue;
        er_cuda_emulator::use(it->second.first).bytes -= it->second.second;
        er_cuda_emulator::allocations().erase(it);
    }
    return std::free(p), cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) { return (*p = std::calloc(1, bytes)) ? cudaSuccess : cudaErrorMemoryAllocation; }
inline cudaError_t cudaFreeHost(void* p) { return std::free(p), cudaSuccess; }
inline cudaError_t cudaMemset(void* p, int v, size_t bytes) { return std::memset(p, v, bytes), cudaSuccess; }
inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) { return std::memmove(to, from, bytes), cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind, cudaStream_t stream = nullptr) {
    er_cuda_emulator::Op op;
    op.to = to, op.from = from, op.bytes = bytes;
    return er_cuda_emulator::submit(std::move(op), stream);
}
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) { return *a = cudaFuncAttributes{}, cudaSuccess; }
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int threads, size_t) {
    return *n = std::max(1, 2048 / std::max(1, threads)), cudaSuccess;
}
inline cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* c, const void* fn, void** args) {
    const auto it = er_cuda_emulator::entries().find(fn);
    if (it == er_cuda_emulator::entries().end()) throw std::logic_error("CUDA emulator: a launch of an unknown entry point");
    if (c->blockDim.y != 1 || c->blockDim.z != 1) throw std::logic_error("CUDA emulator: blocks are one-dimensional here");
    if (c->dynamicSmemBytes > er_cuda_emulator::kSmemPerBlock) throw std::logic_error("CUDA emulator: dynamic shared memory past the limit");
    er_cuda_emulator::Op op;
    op.fn = fn;
    const auto* bytes = static_cast<const unsigned char*>(args[0]);
    op.args.assign(bytes, bytes + it->second);
    op.grid[0] = c->gridDim.x, op.grid[1] = c->gridDim.y, op.grid[2] = c->gridDim.z;
    op.threads = c->blockDim.x;
    return er_cuda_emulator::submit(std::move(op), c->stream);
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    return *s = reinterpret_cast<cudaStream_t>(new er_cuda_emulator::Stream{er_cuda_emulator::current()}), cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) { return delete reinterpret_cast<er_cuda_emulator::Stream*>(s), cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (er_cuda_emulator::capturing()) throw std::logic_error("CUDA emulator: a capture within a capture");
    er_cuda_emulator::capturing() = new er_cuda_emulator::Graph;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
    *g = reinterpret_cast<cudaGraph_t>(er_cuda_emulator::capturing());
    er_cuda_emulator::capturing() = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long = 0) {
    *e = reinterpret_cast<cudaGraphExec_t>(new er_cuda_emulator::Graph(*reinterpret_cast<er_cuda_emulator::Graph*>(g)));
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { return delete reinterpret_cast<er_cuda_emulator::Graph*>(g), cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { return delete reinterpret_cast<er_cuda_emulator::Graph*>(e), cudaSuccess; }
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t stream) {
    if (!er_cuda_emulator::on_current(stream)) return cudaErrorInvalidResourceHandle;
    ++er_cuda_emulator::use(er_cuda_emulator::current()).launches;
    for (const er_cuda_emulator::Op& op : reinterpret_cast<er_cuda_emulator::Graph*>(e)->ops) er_cuda_emulator::run(op);
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return *e = nullptr, cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return *e = nullptr, cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { return *ms = 0.0f, cudaSuccess; }
inline cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** f, unsigned, int, cudaDriverEntryPointQueryResult* r) {
    *f = nullptr;
    *r = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorNotSupported;
}
template <typename T>
cudaError_t cudaMemcpyToSymbol(T&, const void*, size_t) {
    return cudaErrorNotSupported;
}
