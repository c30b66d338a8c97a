// twell_cache_stress: one process of tests/check_cache_processes.sh. Asks a KernelCache on --dir for the
// keys stress<first> .. stress<first + keys - 1> with a compile callback that stands in for NVRTC: it
// appends "start <pid> <key>" to --log (O_APPEND: one line per write, whole), sleeps --compile-ms and
// returns a payload of --bytes bytes that depends only on the key. Every entry obtained (from memory, disk
// or compile) is compared with that payload. Limits come from the environment as in any twell program
// ($TWELL_CACHE_MAX_BYTES, $TWELL_CACHE_LOCK_TIMEOUT_S).
//
// Prints one line: "stress: pid P memory M disk D miss X corrupt C lock_timeouts T evicted E".
// Exit status: 0 all entries right, 1 an entry's bytes differ from the payload, 2 bad usage or I/O error.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "cache.h"

namespace {

using twell::detail::CacheEntry;
using twell::detail::KernelCache;

const char* kUsage =
    "usage: twell_cache_stress --dir D --keys N [--first I] [--compile-ms MS] [--bytes B] [--log FILE]\n"
    "                          [--start-file F]\n"
    "  --start-file F   wait (at most 60 s) until F exists, so that processes started one by one begin together\n";

// The payload of key number `index`: a PTX text naming the kernel, then pseudo-random bytes (xorshift
// seeded by the index) split between PTX and cubin.
CacheEntry payload(long index, long bytes) {
  CacheEntry e;
  e.ptx = ".version 9.0\n.target sm_90a\n.visible .entry stress_" + std::to_string(index) + "()\n";
  uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<char>('!' + x % 90);  // printable: the PTX stays text
  };
  const long half = bytes / 2;
  while (static_cast<long>(e.ptx.size()) < half) e.ptx.push_back(next());
  e.cubin.resize(static_cast<size_t>(bytes - half > 0 ? bytes - half : 0));
  for (char& c : e.cubin) c = next();
  return e;
}

long number(const char* option, const char* text, long min) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    std::fprintf(stderr, "twell_cache_stress: %s: expected an integer >= %ld, got '%s'\n%s", option, min, text, kUsage);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, log, start_file;
  long keys = -1, first = 0, compile_ms = 200, bytes = 100000;
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "twell_cache_stress: %s: expected a value after it\n%s", option.c_str(), kUsage);
      return 2;
    }
    const char* value = argv[++i];
    if (option == "--dir") dir = value;
    else if (option == "--log") log = value;
    else if (option == "--start-file") start_file = value;
    else if (option == "--keys") keys = number("--keys", value, 1);
    else if (option == "--first") first = number("--first", value, 0);
    else if (option == "--compile-ms") compile_ms = number("--compile-ms", value, 0);
    else if (option == "--bytes") bytes = number("--bytes", value, 0);
    else {
      std::fprintf(stderr, "twell_cache_stress: unknown option %s\n%s", option.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty() || keys < 0) {
    std::fprintf(stderr, "twell_cache_stress: expected --dir and --keys\n%s", kUsage);
    return 2;
  }
  int log_fd = -1;
  if (!log.empty() && (log_fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0) {
    std::fprintf(stderr, "twell_cache_stress: --log: cannot open %s: %s\n", log.c_str(), std::strerror(errno));
    return 2;
  }
  if (!start_file.empty()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(start_file)) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "twell_cache_stress: --start-file %s did not appear within 60 s\n", start_file.c_str());
        return 2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  KernelCache cache(dir);
  int wrong = 0;
  for (long index = first; index < first + keys; ++index) {
    const std::string key = "stress" + std::to_string(index);
    KernelCache::Result r = cache.get_or_compile(key, [&] {
      if (log_fd >= 0) {
        const std::string line = "start " + std::to_string(::getpid()) + " " + key + "\n";
        if (::write(log_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::abort();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(compile_ms));
      return payload(index, bytes);
    });
    const CacheEntry expected = payload(index, bytes);
    if (r.entry->ptx != expected.ptx || r.entry->cubin != expected.cubin) {
      std::fprintf(stderr, "twell_cache_stress: pid %d: %s: wrong bytes (%zu PTX + %zu cubin, expected %zu + %zu)\n",
                   static_cast<int>(::getpid()), key.c_str(), r.entry->ptx.size(), r.entry->cubin.size(),
                   expected.ptx.size(), expected.cubin.size());
      ++wrong;
    }
  }
  const twell::detail::CacheStats s = cache.stats();
  std::printf("stress: pid %d memory %llu disk %llu miss %llu corrupt %llu lock_timeouts %llu evicted %llu\n",
              static_cast<int>(::getpid()), static_cast<unsigned long long>(s.memory_hits),
              static_cast<unsigned long long>(s.disk_hits), static_cast<unsigned long long>(s.misses),
              static_cast<unsigned long long>(s.corrupt_entries), static_cast<unsigned long long>(s.lock_timeouts),
              static_cast<unsigned long long>(s.evicted_entries));
  return wrong == 0 ? 0 : 1;
}
