#include "kv_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>

#include "edgerunner/engine.h"
#include "edgerunner/quant_blocks.h"

namespace edgerunner {

size_t available_host_memory() {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string key; meminfo >> key;) {
        size_t kib = 0;
        if (key == "MemAvailable:" && meminfo >> kib) return kib * 1024;
        meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);  // (no /proc: all of it)
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : std::numeric_limits<size_t>::max();
}

KvType parse_kv_type(const std::string& name) {
    if (name == "f32") return KvType::F32;
    if (name == "f16") return KvType::F16;
    if (name == "q8_0") return KvType::Q8_0;
    throw std::invalid_argument("KV cache type '" + name + "' is not supported; supported: f32, f16, q8_0");
}

const char* kv_type_name(KvType t) {
    switch (t) {
        case KvType::F32: return "f32";
        case KvType::F16: return "f16";
        case KvType::Q8_0: return "q8_0";
    }
    return "?";
}

KVCache::KVCache(KvType type_, int64_t n_layer_, int64_t capacity_, int64_t n_head_kv, int64_t head_dim_, bool circular_,
                 bool host_storage)
    : type(type_), n_layer(n_layer_), capacity(capacity_), n_ctx(capacity_), kv_dim(n_head_kv * head_dim_),
      head_dim(head_dim_), circular(circular_), ring(circular_ ? capacity_ : 0),
      layer_capacity(static_cast<size_t>(n_layer_), capacity_) {
    layout(host_storage);
}

KVCache::KVCache(KvType type_, const std::vector<int64_t>& capacities, int64_t n_ctx_, int64_t n_head_kv, int64_t head_dim_,
                 bool host_storage)
    : type(type_), n_layer(static_cast<int64_t>(capacities.size())), n_ctx(n_ctx_), kv_dim(n_head_kv * head_dim_),
      head_dim(head_dim_), layer_capacity(capacities) {
    for (int64_t c : capacities) {
        capacity = std::max(capacity, c);
        if (c < n_ctx) {
            circular = true;
            ring = ring ? std::min(ring, c) : c;
        }
    }
    layout(host_storage);
}

bool KVCache::uniform() const {
    for (int64_t c : layer_capacity)
        if (c != capacity) return false;
    return true;
}

void KVCache::layout(bool host_storage) {
    switch (type) {
        case KvType::F32: row_bytes = static_cast<size_t>(kv_dim) * 4; break;
        case KvType::F16: row_bytes = static_cast<size_t>(kv_dim) * 2; break;
        case KvType::Q8_0:
            if (head_dim % QK8_0 != 0)
                throw std::invalid_argument("KV cache type q8_0 needs a head size that is a multiple of 32 (this model's is " +
                                            std::to_string(head_dim) + "); use f16");
            row_bytes = static_cast<size_t>(kv_dim / QK8_0) * sizeof(block_q8_0);
            break;
    }
    layer_offset.assign(1, 0);  // n_layer + 1 entries: the last is the end, bytes()
    for (int64_t c : layer_capacity) layer_offset.push_back(layer_offset.back() + 2 * static_cast<size_t>(c) * row_bytes);
    if (!host_storage) return;  // a device backend keeps the slots in its own memory
    const std::string where = "host memory (available)";
    const size_t free = available_host_memory();
    if (bytes() > free) throw OutOfMemory(too_big(free, where));
    try {
        storage.reset(new uint8_t[bytes()]);
    } catch (const std::bad_alloc&) {
        throw OutOfMemory(too_big(free, where));
    }
    std::memset(storage.get(), 0, bytes());
}

std::string size_text(size_t bytes) {
    char buf[32];
    if (bytes >= (size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
    else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

std::string KVCache::too_big(size_t free, const std::string& where) const {
    // Layers that hold the whole context grow by a slot's K and V per token; windowed ones are fixed.
    size_t fixed = 0, per_token = 0;
    for (int64_t c : layer_capacity) {
        if (c == n_ctx) per_token += 2 * row_bytes;
        else fixed += 2 * static_cast<size_t>(c) * row_bytes;
    }
    std::string m = "the KV cache for n_ctx=" + std::to_string(n_ctx) + " needs " + size_text(bytes()) + " (" +
                     kv_type_name(type) + ", " + std::to_string(n_layer) + " layers, " + std::to_string(per_token) +
                     " bytes a token); " + where + ": " + size_text(free) + " free. ";
    const int64_t fit = per_token && free > fixed ? static_cast<int64_t>((free - fixed) / per_token) : 0;
    if (fit >= n_ctx) {  // (free enough, the allocation failed all the same)
        m += "The allocation failed all the same: load the model with a smaller n_ctx";
    } else if (fit > 0) {
        // (rounded down to a multiple of 256 where that leaves some, so the figure reads as one)
        m += "Load the model with n_ctx=" + std::to_string(fit >= 512 ? fit / 256 * 256 : fit) + " or less";
    } else {
        m += "Even a short context does not fit: free memory first";
    }
    if (type == KvType::F32) m += ", or with kv_type='f16' and without precise=True (half the bytes)";
    else if (type == KvType::F16 && head_dim % QK8_0 == 0) m += ", or with kv_type='q8_0' (about half the bytes of f16)";
    return m + ".";
}

}  // namespace edgerunner
