// The Metal device, its queue, the kernel library and the pipeline cache; the weights wrapped
// from the file's memory map and the KV cache buffer. Written against Apple's documented Metal
// API (Metal 3, macOS 13+); nothing here has run on Apple hardware yet (see metal/README.md).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "context.h"
#include "edgerunner/engine.h"

namespace edgerunner::metal {
namespace {

std::string text(NSError* error) { return error ? std::string(error.localizedDescription.UTF8String) : std::string("unknown error"); }

// edgerunner.metallib: $EDGERUNNER_METALLIB, else next to the binary this code is linked into
// (the Python extension's folder in a wheel), else the build tree's (C++ apps built in place).
std::string find_metallib() {
    if (const char* env = std::getenv("EDGERUNNER_METALLIB"); env && *env) return env;
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&find_metallib), &info) && info.dli_fname) {
        const auto next_to = std::filesystem::path(info.dli_fname).parent_path() / "edgerunner.metallib";
        if (std::filesystem::exists(next_to)) return next_to.string();
    }
#if defined(ER_METALLIB_BUILD_PATH)
    if (std::filesystem::exists(ER_METALLIB_BUILD_PATH)) return ER_METALLIB_BUILD_PATH;
#endif
    return "";
}

id<MTLLibrary> load_library(id<MTLDevice> device, std::string& problem) {
    NSError* error = nil;
#if defined(ER_METAL_RUNTIME_COMPILE)
    // Development builds (EDGERUNNER_METAL_RUNTIME_COMPILE=ON): the sources are compiled here, from
    // $EDGERUNNER_METAL_SOURCE or the source tree this was built from. Release builds never do this.
    const char* env = std::getenv("EDGERUNNER_METAL_SOURCE");
    const std::string root = env && *env ? env : ER_METAL_SOURCE_DIR;
    try {
        const std::string source = library_source(root);
        MTLCompileOptions* options = [MTLCompileOptions new];
        options.languageVersion = MTLLanguageVersion3_0;
        if (@available(macOS 15.0, *)) options.mathMode = MTLMathModeSafe;  // IEEE floats, as the metallib's -fno-fast-math
        else options.fastMathEnabled = NO;
        id<MTLLibrary> library = [device newLibraryWithSource:[NSString stringWithUTF8String:source.c_str()] options:options error:&error];
        if (!library) problem = "compiling the Metal sources in " + root + " failed: " + text(error);
        return library;
    } catch (const std::exception& e) {
        problem = e.what();
        return nil;
    }
#else
    const std::string path = find_metallib();
    if (path.empty()) {
        problem = "edgerunner.metallib was not found next to the edgerunner library or in the build tree; rebuild, or set "
                  "EDGERUNNER_METALLIB to its path";
        return nil;
    }
    id<MTLLibrary> library = [device newLibraryWithURL:[NSURL fileURLWithPath:[NSString stringWithUTF8String:path.c_str()]] error:&error];
    if (!library) problem = "loading " + path + " failed: " + text(error);
    return library;
#endif
}

void set_constants(MTLFunctionConstantValues* values, const Constants& k) {
    const bool bools[] = {k.accumulate, k.has_bias, k.norm_in, k.neox, k.head_norm, k.store_kv};
    const NSUInteger bool_index[] = {ER_FC_ACCUMULATE, ER_FC_HAS_BIAS, ER_FC_NORM_IN, ER_FC_NEOX, ER_FC_HEAD_NORM, ER_FC_STORE_KV};
    for (int i = 0; i < 6; ++i) [values setConstantValue:&bools[i] type:MTLDataTypeBool atIndex:bool_index[i]];
    [values setConstantValue:&k.glu type:MTLDataTypeUInt atIndex:ER_FC_GLU];
    [values setConstantValue:&k.kv_type type:MTLDataTypeUInt atIndex:ER_FC_KV_TYPE];
}

}  // namespace

Context& context() {
    static Context* c = [] {
        auto* ctx = new Context();
        @autoreleasepool {
            if (@available(macOS 13.0, *)) {
                ctx->device = MTLCreateSystemDefaultDevice();
                if (!ctx->device) ctx->problem = "no Metal device";
                else if (![ctx->device supportsFamily:MTLGPUFamilyMetal3])
                    ctx->problem = std::string(ctx->device.name.UTF8String) + " does not support Metal 3 (argument tables hold GPU addresses)";
                if (ctx->problem.empty()) {
                    ctx->queue = [ctx->device newCommandQueue];
                    ctx->library = load_library(ctx->device, ctx->problem);
                }
            } else {
                ctx->problem = "the Metal backend needs macOS 13 or later";
            }
        }
        return ctx;
    }();
    return *c;
}

Context& usable_context() {
    Context& c = context();
    if (!c.problem.empty()) throw std::runtime_error("Metal: " + c.problem);
    return c;
}

uint64_t address_of(id<MTLBuffer> buffer) {
    if (@available(macOS 13.0, *)) return buffer.gpuAddress;
    throw std::runtime_error("Metal: GPU addresses need macOS 13");
}

id<MTLComputePipelineState> Context::pipeline(const Launch& launch) {
    const std::string key = launch.kernel + " " + launch.constants.key();
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
    @autoreleasepool {
        MTLFunctionConstantValues* values = [MTLFunctionConstantValues new];
        set_constants(values, launch.constants);
        NSError* error = nil;
        id<MTLFunction> fn = [library newFunctionWithName:[NSString stringWithUTF8String:launch.kernel.c_str()] constantValues:values error:&error];
        if (!fn) throw std::runtime_error("Metal: kernel " + key + ": " + text(error));
        MTLComputePipelineDescriptor* d = [MTLComputePipelineDescriptor new];
        d.computeFunction = fn;
        d.supportIndirectCommandBuffers = YES;  // any pipeline may be recorded (recorded dispatch)
        id<MTLComputePipelineState> p = [device newComputePipelineStateWithDescriptor:d options:MTLPipelineOptionNone reflection:nil error:&error];
        if (!p) throw std::runtime_error("Metal: pipeline " + key + ": " + text(error));
        if (p.maxTotalThreadsPerThreadgroup < launch.threads)
            throw std::runtime_error("Metal: kernel " + launch.kernel + " takes at most " + std::to_string(p.maxTotalThreadsPerThreadgroup) +
                                     " threads per threadgroup on this GPU; it is written for " + std::to_string(launch.threads));
        pipelines_[key] = p;
        return p;
    }
}

uint64_t DeviceModel::operator()(const uint8_t* host) const {
    auto it = address.find(host);
    if (it == address.end()) throw std::logic_error("Metal: a weight the plan uses was not wrapped");
    return it->second;
}

// Weights stay where the file is mapped: the mapping is page aligned, so page-aligned windows of it
// become buffers without a copy (newBufferWithBytesNoCopy). One window when the file fits the
// device's largest buffer; otherwise windows of that size every half size, so any weight up to
// half a window lies inside one. A weight in no window (a file parsed from memory, or a weight
// over half the largest buffer) is copied into its own buffer.
std::shared_ptr<DeviceModel> wrap_weights(const GGUFFile& file, const std::vector<const Plan*>& plans) {
    Context& c = usable_context();
    auto m = std::make_shared<DeviceModel>();
    m->mapping = file.mapping();
    const size_t page = static_cast<size_t>(getpagesize());
    const uint8_t* base = file.base();
    const size_t size = (static_cast<size_t>(file.file_size()) + page - 1) / page * page;
    const bool aligned = reinterpret_cast<uintptr_t>(base) % page == 0 && file.mapping() != nullptr;
    const size_t max_len = static_cast<size_t>(c.device.maxBufferLength) / page * page;
    const size_t window = std::min(size, max_len), stride = size <= max_len ? size : max_len / 2 / page * page;
    std::unordered_map<size_t, id<MTLBuffer>> windows;  // by first byte
    @autoreleasepool {
        for (const Plan* plan : plans)
            for (const Op& op : plan->ops)
                for (const Weight* w : {op.weight, op.bias}) {
                    if (!w || m->address.count(w->data)) continue;
                    const size_t bytes = static_cast<size_t>(w->rows) * w->row_bytes;
                    const size_t at = static_cast<size_t>(w->data - base);
                    const size_t start = aligned && stride ? at / stride * stride : 0;
                    if (aligned && at + bytes <= start + window) {
                        __strong id<MTLBuffer>& b = windows[start];
                        if (!b) {
                            b = [c.device newBufferWithBytesNoCopy:const_cast<uint8_t*>(base + start) length:std::min(window, size - start)
                                                           options:MTLResourceStorageModeShared deallocator:nil];
                            if (!b) throw std::runtime_error("Metal: wrapping the model file's mapping failed");
                            m->buffers.push_back(b);
                        }
                        m->address[w->data] = address_of(b) + (at - start);
                    } else {
                        id<MTLBuffer> b = [c.device newBufferWithBytes:w->data length:bytes options:MTLResourceStorageModeShared];
                        if (!b) throw std::runtime_error("Metal: out of memory copying tensor " + std::string(w->name));
                        m->buffers.push_back(b);
                        m->address[w->data] = address_of(b);
                    }
                }
    }
    return m;
}

std::shared_ptr<DeviceKv> make_kv(const KVCache& layout) {
    Context& c = usable_context();
    // The same per-layer capacities and precision give the same slot layout (the host's copy
    // keeps the ring bookkeeping; the device needs offsets and capacities only). After the slots,
    // the token history the penalties read (program.h: kv_buffer_bytes).
    auto kv = std::make_shared<DeviceKv>(
        DeviceKv{KVCache(layout.type, layout.layer_capacity, layout.n_ctx, layout.kv_dim / layout.head_dim, layout.head_dim, false), nil});
    kv->buffer = [c.device newBufferWithLength:kv_buffer_bytes(layout) options:MTLResourceStorageModeShared];
    if (!kv->buffer) {  // (free: the working set the OS recommends, less what this process holds)
        const uint64_t limit = c.device.recommendedMaxWorkingSetSize, held = c.device.currentAllocatedSize;
        throw OutOfMemory(layout.too_big(limit > held ? limit - held : 0, "the GPU's working set (Metal)"));
    }
    std::memset(kv->buffer.contents, 0, kv->buffer.length);
    return kv;
}

Dispatch parse_dispatch(const std::string& name) {
    if (name == "eager") return Dispatch::Eager;
    if (name == "argument_buffers") return Dispatch::ArgumentBuffers;
    if (name == "recorded" || name == "auto") return Dispatch::Recorded;
    throw std::invalid_argument("unknown dispatch mode '" + name + "'; choose eager, argument_buffers, recorded or auto");
}

bool available() { return context().problem.empty(); }

std::string describe() {
    Context& c = context();
    if (!c.problem.empty()) return c.problem;
    const double gib = static_cast<double>(c.device.recommendedMaxWorkingSetSize) / (1u << 30);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s (Metal 3, %.1f GiB working set)", c.device.name.UTF8String, gib);
    return buf;
}

}  // namespace edgerunner::metal
