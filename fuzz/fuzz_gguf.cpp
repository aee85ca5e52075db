// libFuzzer entry point: any byte string must either parse or raise GGUFError, and a parsed
// file's tensor data must lie inside the buffer (ASan checks every byte read).
#include <cstddef>
#include <cstdint>

#include "edgerunner/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto f = edgerunner::GGUFFile::parse(data, size, "fuzz");
        volatile uint8_t sink = 0;
        for (const auto& t : f.tensors()) {
            const uint8_t* p = f.tensor_data(t);
            if (t.n_bytes) sink ^= p[0] ^ p[t.n_bytes - 1];
        }
        for (const auto& kv : f.metadata())
            if (kv.value.count && kv.value.raw) sink ^= static_cast<uint8_t>(kv.value.number_at(kv.value.count - 1));
        (void)sink;
    } catch (const edgerunner::GGUFError&) {
    }
    return 0;
}
