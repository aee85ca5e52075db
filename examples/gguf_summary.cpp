// Prints a GGUF file's summary using only the static core library (no Python).
//   cmake -S . -B build -DEDGERUNNER_EXAMPLES=ON && cmake --build build --target gguf_summary
//   build/examples/gguf_summary model.gguf
#include <cstdio>
#include <map>
#include <string>

#include "edgerunner/gguf.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    try {
        auto file = edgerunner::GGUFFile::open(argv[1]);
        std::string arch(file.get_string("general.architecture", "(not set)"));
        std::printf("file: %s\n", file.path().c_str());
        std::printf("gguf version: %u, alignment: %llu, size: %llu bytes\n", file.version(),
                    static_cast<unsigned long long>(file.alignment()),
                    static_cast<unsigned long long>(file.file_size()));
        std::printf("architecture: %s\n", arch.c_str());
        std::printf("metadata keys: %zu\n", file.metadata().size());
        for (const char* field : {"context_length", "embedding_length", "block_count", "attention.head_count"}) {
            std::string key = arch + "." + field;
            if (file.find(key)) std::printf("  %s: %llu\n", key.c_str(), static_cast<unsigned long long>(file.get_uint(key, 0)));
        }
        std::map<std::string, std::pair<int, unsigned long long>> histogram;
        unsigned long long params = 0;
        for (const auto& t : file.tensors()) {
            auto& h = histogram[std::string(edgerunner::tensor_type_name(t.type))];
            h.first += 1;
            h.second += t.n_bytes;
            params += t.n_elements;
        }
        std::printf("tensors: %zu, parameters: %llu\n", file.tensors().size(), params);
        for (const auto& [name, h] : histogram) std::printf("  %-8s %5d tensors %14llu bytes\n", name.c_str(), h.first, h.second);
        if (const auto* tokens = file.find("tokenizer.ggml.tokens"))
            std::printf("tokenizer: %s, %llu tokens\n", std::string(file.get_string("tokenizer.ggml.model", "?")).c_str(),
                        static_cast<unsigned long long>(tokens->count));
        std::printf("chat template: %s\n", file.find("tokenizer.chat_template") ? "present" : "absent");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
