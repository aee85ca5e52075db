// A fixed team of threads for one step at a time. run(fn) calls fn(ith, nth) on every thread
// (the caller is thread 0); inside, barrier() separates ops. Workers spin briefly for the next
// job, then sleep, so a decode loop pays no wake-up latency while an idle model burns no CPU.
// Jobs run with subnormal floats flushed to zero (x86 FTZ + DAZ; the caller's own setting is
// restored after run): a softmax weight near 1e-38 times a V value would otherwise cost a
// ~100-cycle microcode assist per product, and such values carry no information here.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace edgerunner::cpu {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    void run(const std::function<void(int ith, int nth)>& fn);
    void barrier();  // all threads of the current run() meet here

private:
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<int> barrier_count_{0};
    std::atomic<uint64_t> barrier_phase_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
};

}  // namespace edgerunner::cpu
