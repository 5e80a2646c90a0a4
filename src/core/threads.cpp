#include "core/threads.h"

#include <algorithm>

namespace sala {

ThreadPool::ThreadPool(int threads) {
  int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_piece(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int parts) {
  int64_t begin = n * index / parts, end = n * (index + 1) / parts;
  if (begin < end) fn(begin, end);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    std::exception_ptr err;
    try {
      run_piece(*job, n, index, size());
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    pending_ = int(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr err;
  try {
    run_piece(fn, n, 0, size());
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (!err) err = error_;
  if (err) std::rethrow_exception(err);
}

}  // namespace sala
