#include "common/parallel_for.h"

#include <dirent.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace harrier {
namespace {

// Threads of this process now (/proc/self/task), or -1 where unreadable.
int CountThreads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) ++count;
  }
  closedir(dir);
  return count;
}

TEST_CASE("every part runs exactly once, for any pool size and part count") {
  for (int threads : {1, 2, 3, 8}) {
    ParallelForPool pool(threads);
    CHECK(pool.num_threads() == threads);
    for (size_t parts : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      INFO("threads " << threads << " parts " << parts);
      std::vector<std::atomic<int>> runs(parts);
      pool.Run(parts, [&](size_t part) { runs[part].fetch_add(1); });
      for (size_t i = 0; i < parts; ++i) CHECK(runs[i].load() == 1);
    }
  }
}

TEST_CASE("the parts' writes are visible when Run returns") {
  ParallelForPool pool(4);
  for (int round = 0; round < 200; ++round) {
    std::vector<uint64_t> out(64, 0);  // plain memory, one slot per part
    pool.Run(out.size(), [&](size_t part) { out[part] = part * part + round; });
    for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == i * i + round);
  }
}

TEST_CASE("nested calls complete on the pool's own threads") {
  ParallelForPool pool(3);
  std::atomic<int> leaves{0};
  pool.Run(6, [&](size_t) {
    pool.Run(5, [&](size_t) {
      pool.Run(4, [&](size_t) { leaves.fetch_add(1); });
    });
  });
  CHECK(leaves.load() == 6 * 5 * 4);
}

TEST_CASE("a call on a busy pool completes on the caller") {
  ParallelForPool pool(3);  // the caller and 2 pool threads
  absl::Notification release;
  std::atomic<int> blocked{0};
  // Three parts that hold their threads until released: the pool thread
  // that runs this call, and both pool threads.
  std::thread occupier([&] {
    pool.Run(3, [&](size_t) {
      blocked.fetch_add(1);
      release.WaitForNotification();
    });
  });
  while (blocked.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> ran{0};
  std::atomic<int> on_caller{0};
  pool.Run(100, [&](size_t) {
    ran.fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
  });
  CHECK(ran.load() == 100);
  CHECK(on_caller.load() == 100);  // every pool thread was busy
  release.Notify();
  occupier.join();
}

TEST_CASE("calls from many threads at once all complete") {
  ParallelForPool pool(4);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 100; ++i) pool.Run(9, [&](size_t) { total.fetch_add(1); });
    });
  }
  for (std::thread& thread : callers) thread.join();
  CHECK(total.load() == 8 * 100 * 9);
}

TEST_CASE("the thread count does not grow with calls") {
  // The default pool starts its threads on first use.
  std::atomic<int> sum{0};
  ParallelFor(4, [&](size_t part) { sum.fetch_add(static_cast<int>(part)); });
  ParallelForPool own(4);
  const int before = CountThreads();
  REQUIRE(before > 0);
  for (int i = 0; i < 1000; ++i) {
    ParallelFor(8, [&](size_t part) { sum.fetch_add(static_cast<int>(part)); });
    ParallelFor(&own, 8, [&](size_t part) { sum.fetch_add(static_cast<int>(part)); });
  }
  CHECK(CountThreads() == before);
  CHECK(sum.load() == 6 + 2000 * 28);
  CHECK(ParallelForPool::Default().num_threads() == ParallelForPool::DefaultThreads());
  CHECK(ParallelForPool::DefaultThreads() >= 1);
  CHECK(ParallelForPool::DefaultThreads() <= ParallelForPool::kMaxDefaultThreads);
}

TEST_CASE("RunRanges covers [0, n) in part_size ranges") {
  ParallelForPool pool(3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{9}, size_t{10}, size_t{11}, size_t{1001}}) {
    INFO("n " << n);
    std::vector<std::atomic<int>> covered(n);
    std::atomic<size_t> parts{0};
    // Catch2's assertions are not thread-safe: the parts count what is
    // wrong, the test thread checks it.
    std::atomic<int> misplaced{0};
    pool.RunRanges(n, 10, [&](size_t part, size_t begin, size_t end) {
      parts.fetch_add(1);
      if (begin != part * 10 || end != std::min(n, begin + 10)) misplaced.fetch_add(1);
      for (size_t i = begin; i < end; ++i) covered[i].fetch_add(1);
    });
    CHECK(misplaced.load() == 0);
    CHECK(parts.load() == (n + 9) / 10);
    for (size_t i = 0; i < n; ++i) CHECK(covered[i].load() == 1);
  }
}

TEST_CASE("a float reduction in part order has the same bits for every pool size") {
  std::vector<float> values(100003);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.37f;
  }
  auto reduce = [&](int threads) {
    ParallelForPool pool(threads);
    constexpr size_t kPart = 4096;
    std::vector<float> partial((values.size() + kPart - 1) / kPart, 0.0f);
    pool.RunRanges(values.size(), kPart, [&](size_t part, size_t begin, size_t end) {
      float sum = 0.0f;
      for (size_t i = begin; i < end; ++i) sum += values[i];
      partial[part] = sum;
    });
    float total = 0.0f;
    for (float p : partial) total += p;
    return total;
  };
  const float reference = reduce(1);
  for (int threads : {2, 3, 5, 8}) {
    const float total = reduce(threads);
    CHECK(std::memcmp(&total, &reference, sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace harrier
