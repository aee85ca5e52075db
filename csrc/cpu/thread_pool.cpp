#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ER_PAUSE() _mm_pause()
#else
#define ER_PAUSE() std::this_thread::yield()
#endif

namespace edgerunner::cpu {
namespace {
constexpr int kSpins = 1 << 16;  // ~ tens of microseconds of spinning before sleeping

// Flush subnormals (FTZ, bit 15) and read them as zero (DAZ, bit 6) while in scope.
class FlushSubnormals {
public:
#if defined(__x86_64__) || defined(__i386__)
    FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
    ~FlushSubnormals() { _mm_setcsr(saved_); }

private:
    unsigned saved_;
#endif
};
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        FlushSubnormals flush;
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    FlushSubnormals flush;
    fn(0, n_threads_);
    while (pending_.load(std::memory_order_acquire) != 0) ER_PAUSE();
    job_ = nullptr;
}

void ThreadPool::barrier() {
    if (n_threads_ == 1) return;
    const uint64_t phase = barrier_phase_.load(std::memory_order_acquire);
    if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
        barrier_count_.store(0, std::memory_order_relaxed);
        barrier_phase_.fetch_add(1, std::memory_order_release);
        return;
    }
    int spins = 0;
    while (barrier_phase_.load(std::memory_order_acquire) == phase) {
        if (++spins < kSpins) ER_PAUSE();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker(int ith) {
    FlushSubnormals flush;  // for the thread's life
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen && spins < kSpins) {
            ER_PAUSE();
            ++spins;
        }
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        (*job_)(ith, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace edgerunner::cpu
