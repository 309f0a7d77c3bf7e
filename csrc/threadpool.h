// A small pool of pinned worker threads for row-parallel kernels.
//
// run(nth, fn) calls fn(i, nth) once for every part i in [0, nth) and returns when all are
// done. Parts are claimed from an atomic counter by the caller and by whichever workers are
// awake: on a quiet machine each thread takes one part; on a busy one a descheduled worker
// simply takes no part, and the caller runs it instead of waiting for that worker to be
// scheduled again. Workers spin briefly on a generation counter, then sleep.
// Callers split rows by i only (never by thread), so a row's result never depends on nth or
// on which thread ran it (invariant I3).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <sched.h>
#include <thread>
#include <vector>

namespace lowbit {

class ThreadPool {
public:
    static ThreadPool &instance();
    // Threads available (hardware concurrency, or LOWBIT_THREADS).
    int size() const { return (int)workers_.size() + 1; }
    void run(int nth, const std::function<void(int, int)> &fn);
    ~ThreadPool();

private:
    explicit ThreadPool(int n);
    void worker();

    std::vector<std::thread> workers_;
    std::mutex run_mu_;  // one run() at a time
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<uint64_t> gen_{0};   // bumped when a job is published
    std::atomic<int> next_{0};       // the next part of the current job to claim
    std::atomic<int> active_{0};     // workers inside the current job
    std::atomic<bool> open_{false};  // the current job may still be joined
    const std::function<void(int, int)> *job_ = nullptr;
    int job_nth_ = 0;
    bool stop_ = false;
};

// Step s (0, 1, 2, ...) of a wait for another thread of a dispatch: a CPU pause for the first
// 2048 steps (microseconds, while that thread owns its core), then sched_yield (it has probably
// been descheduled by another process: give the core away rather than burn its time slice).
inline void wait_step(int s) {
    if (s < 2048) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    } else {
        sched_yield();
    }
}

// Split [0, n) into nth contiguous parts; part i is [*b, *e).
inline void split_range(int64_t n, int i, int nth, int64_t *b, int64_t *e) {
    const int64_t per = n / nth, rem = n % nth;
    *b = i * per + (i < rem ? i : rem);
    *e = *b + per + (i < rem ? 1 : 0);
}

}  // namespace lowbit
