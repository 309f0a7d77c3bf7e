#include "threadpool.h"

#include <cstdlib>
#include <pthread.h>
#include <sched.h>

namespace lowbit {

static void pin_to_cpu(int i) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    const int count = CPU_COUNT(&allowed);
    if (count <= 1) return;
    int k = i % count;  // i-th allowed CPU
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (k-- == 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
            return;
        }
    }
}

static int default_threads() {
    if (const char *s = std::getenv("LOWBIT_THREADS"); s && *s) {
        const int n = std::atoi(s);
        if (n >= 1 && n <= 1024) return n;
    }
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) return CPU_COUNT(&allowed);
    const unsigned h = std::thread::hardware_concurrency();
    return h ? (int)h : 1;
}

ThreadPool &ThreadPool::instance() {
    static ThreadPool pool(default_threads());
    return pool;
}

ThreadPool::ThreadPool(int n) {
    // Workers 1..n-1 are pinned to the 2nd.. allowed CPUs; the calling thread is not
    // pinned (it belongs to the user's program), it just takes part 0.
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { pin_to_cpu(i); worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
        gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::worker(int idx) {
    uint64_t seen = 0;
    for (;;) {
        // Spin a little (the next layer's call usually comes within microseconds), then sleep.
        for (int s = 0; s < 20000 && gen_.load(std::memory_order_acquire) == seen; ++s) __builtin_ia32_pause();
        if (gen_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        }
        seen = gen_.load(std::memory_order_acquire);
        if (stop_) return;
        const std::function<void(int, int)> *job = job_;
        const int nth = job_nth_;
        if (idx < nth) (*job)(idx, nth);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::run(int nth, const std::function<void(int, int)> &fn) {
    if (nth > size()) nth = size();
    if (nth <= 1) { fn(0, 1); return; }
    std::lock_guard<std::mutex> one(run_mu_);
    {
        std::lock_guard<std::mutex> g(mu_);
        job_ = &fn;
        job_nth_ = nth;
        pending_.store((int)workers_.size(), std::memory_order_release);
        gen_.fetch_add(1, std::memory_order_acq_rel);
    }
    cv_.notify_all();
    fn(0, nth);
    while (pending_.load(std::memory_order_acquire) != 0) __builtin_ia32_pause();
}

}  // namespace lowbit
