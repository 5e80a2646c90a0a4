// A small fixed thread pool for the CPU backend: parallel_for over an index range.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sala {

class ThreadPool {
 public:
  explicit ThreadPool(int threads = 0);  // 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end) on contiguous pieces of [0, n); returns when all are done.
  // Exceptions from fn are rethrown in the caller. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace sala
