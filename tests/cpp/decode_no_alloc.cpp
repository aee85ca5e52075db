// Counts heap allocations: a decode step (append + sample) must make none.
//   decode_no_alloc MODEL.gguf  -> prints "allocations during N decode steps: K", exits 0 iff K == 0
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "edgerunner/engine.h"

static std::atomic<long> g_allocations{0};

void* operator new(std::size_t n) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const int kSteps = 32;
    for (bool precise : {false, true}) {
        edgerunner::LoadOptions options;
        options.n_threads = 2;
        options.precise = precise;
        auto model = edgerunner::Model::load(argv[1], options);
        edgerunner::Session session(model);
        edgerunner::SamplingParams params;
        params.temperature = 0.8f;
        params.top_k = 40;
        params.top_p = 0.9f;
        params.repetition_penalty = 1.1f;
        edgerunner::Sampler sampler(static_cast<int32_t>(model->config().n_vocab), params);
        std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
        session.eval(prompt.data(), prompt.size());
        session.append(session.sample(sampler));  // first decode: warm every path once

        const long before = g_allocations.load();
        for (int i = 0; i < kSteps; ++i) session.append(session.sample(sampler));
        const long during = g_allocations.load() - before;
        std::printf("%s: allocations during %d decode steps: %ld\n", precise ? "precise" : "fast", kSteps, during);
        if (during != 0) return 1;
    }
    return 0;
}
