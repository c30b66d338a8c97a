// The kernel cache (ARCHITECTURE.md, "Cache"): compiled kernels keyed by everything that can change
// the binary, in memory and on disk.
//
// On disk: one file per key, <dir>/<key>.twk, little-endian:
//   offset  0  char[8]  magic "TWELLK01"
//           8  u32      format version (kFormatVersion)
//          12  u32      header bytes (48)
//          16  u64      PTX bytes
//          24  u64      cubin bytes
//          32  u64      XXH64 (seed 0) of the payload (PTX then cubin)
//          40  u64      XXH64 (seed 0) of the key (a file renamed to another key is not loaded)
//          48  PTX, then cubin
// A file is published whole (written to a unique temp file in the same directory, fsync'ed, renamed
// over <key>.twk, directory fsync'ed), so readers never see a partial one. Writers of one key are
// serialized across processes by flock on <key>.lock (lock files stay: unlinking a lock file others may
// be waiting on would let two processes hold "the" lock at once). An entry that fails validation
// (magic, version, sizes against the file size, key, checksum) is deleted, counted and recompiled —
// never loaded. Anything at an entry's or a lock's path that is not a regular file (FIFO, socket,
// device, symbolic link) is never opened in a way that can block: an entry path holding one counts as a
// corrupt entry and is replaced; a lock path holding one is replaced (a directory at either path is left
// alone and that key is cached in memory only).
//
// Reading needs no write access: a read-only directory serves its valid entries, and kernels missing
// from it are compiled and kept in memory. A failure on one key's files (lock, publish) affects only
// that key; only the directory itself disappearing turns the disk cache off.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace twell::detail {

struct CacheEntry {
  std::string ptx;
  std::vector<char> cubin;  // empty for PTX-only entries
};

enum class CacheHit { Memory, Disk, Miss };

struct CacheStats {
  uint64_t memory_hits = 0;
  uint64_t disk_hits = 0;
  uint64_t misses = 0;           // compile callbacks run (including ones that threw)
  uint64_t corrupt_entries = 0;  // disk entries that failed validation (deleted where the directory is writable)
};

class KernelCache {
 public:
  static constexpr uint32_t kFormatVersion = 1;

  // `dir` empty: memory only. Otherwise the directory is created if needed and probed for writing. If it
  // cannot be created or read the cache continues in memory only; if it is read-only its entries are
  // still used and new kernels are kept in memory only; if writing one key's files fails later, that key
  // is kept in memory only. Each of these warns once on stderr for this cache: compiles never fail
  // because of the disk cache.
  explicit KernelCache(std::filesystem::path dir);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // $TWELL_CACHE_DIR if set and non-empty; else $XDG_CACHE_HOME/twell if that is an absolute path;
  // else $HOME/.cache/twell (the passwd entry's home when HOME is unset); empty (memory only) if no home.
  static std::filesystem::path default_dir();

  // 32 lowercase hex digits: XXH3-128 over the fields, each prefixed by its length (options by their
  // count, then each option), after a format tag, so no two different field lists share a key.
  static std::string make_key(std::string_view source, std::string_view nvrtc_version,
                             const std::vector<std::string>& options, std::string_view arch,
                             std::string_view twell_version);

  struct Result {
    std::shared_ptr<const CacheEntry> entry;
    CacheHit hit;
  };

  // The entry for `key`: from memory; else from disk (then kept in memory); else from compile(), which
  // is then published to memory and disk. Thread-safe: concurrent calls for one key run compile() once
  // (the others wait and get a Memory hit); across processes sharing the directory, the per-key lock
  // makes the later process wait and load the earlier one's entry. An exception from compile()
  // propagates and caches nothing. Throws Error(InvalidArgument) for a key that is empty, longer than 128
  // characters or has characters outside [0-9A-Za-z_-] (keys become file names).
  Result get_or_compile(const std::string& key, const std::function<CacheEntry()>& compile);

  CacheStats stats() const;
  // The directory as configured (empty for memory only), whether or not it is still in use.
  const std::filesystem::path& dir() const noexcept { return dir_; }
  // True while the directory is in use: entries are read from it (and published when writable()). False
  // for memory only, or once the directory could not be created or read, or has disappeared.
  bool persistent() const noexcept { return persistent_.load(std::memory_order_relaxed); }
  // True while new entries are published to the directory: persistent() and the directory was writable
  // when the cache was opened.
  bool writable() const noexcept { return writable_.load(std::memory_order_relaxed); }
  // <dir>/<key>.twk
  std::filesystem::path entry_path(std::string_view key) const;
  // Forgets the in-memory entries (entries handed out stay valid); the next lookups go to disk.
  void drop_memory();

 private:
  struct Slot;
  std::shared_ptr<Slot> slot(const std::string& key);
  void disable_disk(const std::string& why);
  void warn_not_published(const std::string& why);
  void key_failed(const std::string& why);

  std::filesystem::path dir_;
  std::atomic<bool> persistent_{false};
  std::atomic<bool> writable_{false};
  std::string read_only_reason_;  // why a persistent directory is not writable (set by the constructor)
  std::once_flag warned_;          // the disk cache is off
  std::once_flag warned_publish_;  // some kernels are not published
  mutable std::mutex mutex_;  // guards slots_
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, misses_{0}, corrupt_entries_{0};
};

}  // namespace twell::detail
