#include "kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "edgerunner/quant_blocks.h"

namespace edgerunner {

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
    : type(type_), n_layer(n_layer_), capacity(capacity_), kv_dim(n_head_kv * head_dim_), head_dim(head_dim_),
      circular(circular_), ring(circular_ ? capacity_ : 0), layer_capacity(static_cast<size_t>(n_layer_), capacity_) {
    layout(host_storage);
}

KVCache::KVCache(KvType type_, const std::vector<int64_t>& capacities, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_,
                 bool host_storage)
    : type(type_), n_layer(static_cast<int64_t>(capacities.size())), kv_dim(n_head_kv * head_dim_), head_dim(head_dim_),
      layer_capacity(capacities) {
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
    storage.reset(new uint8_t[bytes()]);
    std::memset(storage.get(), 0, bytes());
}

}  // namespace edgerunner
