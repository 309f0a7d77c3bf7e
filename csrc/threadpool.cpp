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
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { pin_to_cpu(i); worker(); });
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

void ThreadPool::worker() {
    uint64_t seen = 0;
    for (;;) {
        // Spin a little (the next layer's call usually comes within microseconds), yielding
        // the core now and then in case the caller was descheduled, then sleep.
        for (int s = 0; s < 20000 && gen_.load(std::memory_order_acquire) == seen; ++s) {
            if ((s & 1023) == 1023) sched_yield();
            else __builtin_ia32_pause();
        }
        if (gen_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        }
        seen = gen_.load(std::memory_order_acquire);
        if (stop_) return;
        // Join: announce first, then check the job is still open and still the one we saw.
        // (seq_cst pairs with run(): either run() sees this worker active and waits, or this
        // worker sees the job closed and never touches it.)
        active_.fetch_add(1);
        if (open_.load() && gen_.load() == seen) {
            const std::function<void(int, int)> *job = job_;
            const int nth = job_nth_;
            for (int p; (p = next_.fetch_add(1)) < nth;) (*job)(p, nth);
        }
        active_.fetch_sub(1);
    }
}

void ThreadPool::run(int nth, const std::function<void(int, int)> &fn) {
    if (nth <= 1 || workers_.empty()) {
        for (int p = 0; p < nth; ++p) fn(p, nth);
        return;
    }
    std::lock_guard<std::mutex> one(run_mu_);
    {
        std::lock_guard<std::mutex> g(mu_);
        job_ = &fn;
        job_nth_ = nth;
        next_.store(0);
        open_.store(true);
        gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (int p; (p = next_.fetch_add(1)) < nth;) fn(p, nth);
    open_.store(false);
    // Wait for workers still inside a part (microseconds when they own their cores).
    for (int s = 0; active_.load() != 0; ++s) wait_step(s);
}

}  // namespace lowbit
