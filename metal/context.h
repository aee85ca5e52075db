// The Metal objects the backend's Objective-C++ files share: the device, one command queue, the
// kernel library and the pipeline cache; the weights and KV cache as buffers. Objective-C++
// only (device.mm, runner.mm); the rest of the code sees metal.h.
#pragma once

#import <Metal/Metal.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "metal.h"
#include "program.h"

namespace edgerunner::metal {

class Context {
public:
    id<MTLDevice> device = nil;
    id<MTLCommandQueue> queue = nil;
    id<MTLLibrary> library = nil;
    std::string problem;  // why the backend cannot run here (empty: it can)

    // The pipeline for a launch's kernel specialized with its function constants: created on
    // first use (the library is precompiled: this is specialization, not compilation), then
    // cached under (kernel name, constant values).
    id<MTLComputePipelineState> pipeline(const Launch& launch);

private:
    std::mutex mutex_;
    std::unordered_map<std::string, id<MTLComputePipelineState>> pipelines_;
};

Context& context();        // made once, on first use
Context& usable_context();  // throws std::runtime_error naming the problem when the backend cannot run
uint64_t address_of(id<MTLBuffer> buffer);  // the buffer's GPU address (Metal 3)

struct DeviceModel {
    std::shared_ptr<const void> mapping;          // keeps the file mapped while buffers point into it
    std::vector<id<MTLBuffer>> buffers;           // no-copy windows of the mapping, and copies
    std::unordered_map<const uint8_t*, uint64_t> address;  // a weight's bytes in the mapping → GPU address
    uint64_t operator()(const uint8_t* host) const;
};

struct DeviceKv {
    KVCache layout;  // geometry only (no host storage)
    id<MTLBuffer> buffer = nil;  // the slots, then the token history (program.h: kv_buffer_bytes)
};

}  // namespace edgerunner::metal
