// The kernels' timeline for measurements (trace.cuh): one buffer for the process, added to the
// file EDGERUNNER_CUDA_TRACE names whenever a step runner is destroyed.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "check.cuh"
#include "trace.cuh"

namespace edgerunner::cuda {
namespace {

struct Trace {
    std::mutex mutex;
    std::string path;
    TraceSlot slot{};
    std::vector<std::string> kernels;
};

Trace& trace() {
    static Trace t;
    return t;
}

}  // namespace

const TraceSlot* trace_buffer() {
    static const TraceSlot* buffer = []() -> const TraceSlot* {
        const char* path = std::getenv("EDGERUNNER_CUDA_TRACE");
        if (!path || !*path) return nullptr;
#ifndef ER_CUDA_TRACE
        std::fprintf(stderr, "edgerunner: EDGERUNNER_CUDA_TRACE is set, but this build has no trace (build with "
                             "-C cmake.define.EDGERUNNER_CUDA_TRACE=ON)\n");
        return nullptr;
#else
        constexpr unsigned kTraceCapacity = 1u << 22;  // records (224 MB)
        Trace& t = trace();
        t.path = path;
        ER_CUDA(cudaMalloc(&t.slot.records, sizeof(TraceRecord) * kTraceCapacity));
        ER_CUDA(cudaMalloc(&t.slot.count, sizeof(unsigned)));
        ER_CUDA(cudaMemset(t.slot.count, 0, sizeof(unsigned)));
        t.slot.capacity = kTraceCapacity;
        return &t.slot;
#endif
    }();
    return buffer;
}

unsigned trace_kernel(const char* name) {
    Trace& t = trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.kernels.emplace_back(name);
    return static_cast<unsigned>(t.kernels.size() - 1);
}

void trace_flush() {
    if (!trace_buffer()) return;
    Trace& t = trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    ER_CUDA(cudaDeviceSynchronize());
    unsigned n = 0;
    ER_CUDA(cudaMemcpy(&n, t.slot.count, sizeof n, cudaMemcpyDeviceToHost));
    std::vector<TraceRecord> records(std::min(n, t.slot.capacity));
    ER_CUDA(cudaMemcpy(records.data(), t.slot.records, records.size() * sizeof(TraceRecord), cudaMemcpyDeviceToHost));
    ER_CUDA(cudaMemset(t.slot.count, 0, sizeof(unsigned)));
    if (records.empty()) return;
    FILE* f = std::fopen(t.path.c_str(), "a");  // (a session's two runners flush one after the other)
    if (!f) return;
    std::fseek(f, 0, SEEK_END);
    if (std::ftell(f) == 0) std::fprintf(f, "kernel,sm,block,blocks,start,waited,end,mark0,mark1\n");
    for (const TraceRecord& r : records) {
        std::string name = r.kernel < t.kernels.size() ? t.kernels[r.kernel] : "?";
        for (char& c : name)
            if (c == ',') c = ';';
        std::fprintf(f, "%s,%u,%u,%u,%llu,%llu,%llu,%llu,%llu\n", name.c_str(), r.sm, r.block, r.blocks,
                     static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.waited), static_cast<unsigned long long>(r.end),
                     static_cast<unsigned long long>(r.mark[0]), static_cast<unsigned long long>(r.mark[1]));
    }
    std::fclose(f);
    if (n > t.slot.capacity) std::fprintf(stderr, "edgerunner: the CUDA trace kept the first %u of %u blocks\n", t.slot.capacity, n);
}

}  // namespace edgerunner::cuda
