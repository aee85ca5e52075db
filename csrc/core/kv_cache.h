// KV cache bookkeeping: one preallocated slab, per layer a K and a V region of that layer's
// capacity, each slot one token's kv_dim values in the cache precision. Position p lives in slot
// p % capacity, so the same layout serves a full cache (capacity = context length) and a
// circular one for sliding-window attention (capacity = window + prefill chunk) — per layer, so
// a model that mixes local and global layers (Gemma 3) keeps only the window for the local ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace edgerunner {

enum class KvType { F32, F16, Q8_0 };
size_t available_host_memory();  // bytes the OS can give without swapping (Linux: MemAvailable)
std::string size_text(size_t bytes);  // "42.5 MiB", "1.5 GiB": sizes in messages
KvType parse_kv_type(const std::string& name);  // "f32", "f16", "q8_0"; throws otherwise
const char* kv_type_name(KvType t);

struct KVCache {
    KvType type = KvType::F16;
    int64_t n_layer = 0;
    int64_t capacity = 0;   // slots of the largest layer
    int64_t n_ctx = 0;      // the context it serves (a windowed layer's capacity may be less)
    int64_t kv_dim = 0;     // n_head_kv * head_dim
    int64_t head_dim = 0;
    bool circular = false;  // some layer's positions may exceed its capacity (sliding window)
    int64_t ring = 0;       // the smallest circular layer's capacity (0: none)
    size_t row_bytes = 0;   // bytes of one slot's K (or V)
    std::vector<int64_t> layer_capacity;  // per layer: slots (a windowed layer may hold fewer)
    std::vector<size_t> layer_offset;     // per layer: where its K slots start (its V slots follow)
    std::unique_ptr<uint8_t[]> storage;

    // Every layer `capacity` slots, all circular or none.
    KVCache(KvType type, int64_t n_layer, int64_t capacity, int64_t n_head_kv, int64_t head_dim, bool circular,
            bool host_storage = true);
    // Per-layer capacities: a layer whose capacity is below n_ctx is circular.
    KVCache(KvType type, const std::vector<int64_t>& capacities, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim,
            bool host_storage = true);
    size_t bytes() const { return layer_offset.empty() ? 0 : layer_offset.back(); }
    int64_t capacity_of(int64_t layer) const { return layer_capacity[static_cast<size_t>(layer)]; }
    bool uniform() const;  // every layer the same capacity
    // OutOfMemory's message where bytes() exceed the `free` bytes of `where` (e.g. "host memory
    // (available)"): n_ctx, the precision, the bytes and the n_ctx that would fit. The host
    // storage is checked so before it is allocated, a device backend's cache likewise.
    std::string too_big(size_t free, const std::string& where) const;
    uint8_t* k(int64_t layer, int64_t pos) { return slot(layer, 0, pos); }
    uint8_t* v(int64_t layer, int64_t pos) { return slot(layer, 1, pos); }

private:
    void layout(bool host_storage);
    uint8_t* slot(int64_t layer, int kv, int64_t pos) {
        const int64_t cap = layer_capacity[static_cast<size_t>(layer)];
        return storage.get() + layer_offset[static_cast<size_t>(layer)] + static_cast<size_t>(kv * cap + pos % cap) * row_bytes;
    }
};

}  // namespace edgerunner
