// KV cache bookkeeping: one preallocated slab, per layer a K and a V region of `capacity`
// slots, each slot one token's kv_dim values in the cache precision. Position p lives in slot
// p % capacity, so the same layout serves a full cache (capacity = context length) and a
// circular one for sliding-window attention (capacity = window + prefill chunk).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace edgerunner {

enum class KvType { F32, F16, Q8_0 };
KvType parse_kv_type(const std::string& name);  // "f32", "f16", "q8_0"; throws otherwise
const char* kv_type_name(KvType t);

struct KVCache {
    KvType type = KvType::F16;
    int64_t n_layer = 0;
    int64_t capacity = 0;   // slots per layer
    int64_t kv_dim = 0;     // n_head_kv * head_dim
    int64_t head_dim = 0;
    bool circular = false;  // positions may exceed capacity (sliding window)
    size_t row_bytes = 0;   // bytes of one slot's K (or V)
    std::unique_ptr<uint8_t[]> storage;

    KVCache(KvType type, int64_t n_layer, int64_t capacity, int64_t n_head_kv, int64_t head_dim, bool circular,
            bool host_storage = true);
    size_t bytes() const { return static_cast<size_t>(2 * n_layer * capacity) * row_bytes; }
    uint8_t* k(int64_t layer, int64_t pos) { return slot(layer, 0, pos); }
    uint8_t* v(int64_t layer, int64_t pos) { return slot(layer, 1, pos); }

private:
    uint8_t* slot(int64_t layer, int kv, int64_t pos) {
        return storage.get() + (static_cast<size_t>((layer * 2 + kv) * capacity + pos % capacity)) * row_bytes;
    }
};

}  // namespace edgerunner
