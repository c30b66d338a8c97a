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
// A file is published whole (written to a unique temp file .<key>.<pid>.<tid>.<n>.tmp in the same
// directory, fsync'ed, renamed over <key>.twk, directory fsync'ed), so readers never see a partial one.
// An entry that fails validation (magic, version, sizes against the file size, key, checksum) is deleted,
// counted, reported (Result::corrupt) and recompiled — never loaded. Anything at an entry's or a lock's
// path that is not a regular file (FIFO, socket, device, symbolic link) is never opened in a way that can
// block: an entry path holding one counts as a corrupt entry and is replaced; a lock path holding one is
// replaced (a directory at either path is left alone and that key is cached in memory only).
//
// Locks. Writers of one key are serialized across processes by flock on <key>.lock. A lock file may be
// removed, but only by a process holding it (eviction, clear(), remove_key()); so every locker, once its
// flock succeeds, checks that the file it locked is still the one at the path (st_dev and st_ino of the
// descriptor and of the path) and otherwise opens the path again: two processes never both hold "the"
// lock. Waiting is bounded (CacheLimits::lock_timeout, $TWELL_CACHE_LOCK_TIMEOUT_S, default 30 s): a
// holder that is stopped (SIGSTOP) or hung delays the others at most that long; a waiter says on stderr
// what it waits for after 1 s, and after the timeout warns and compiles the kernel in memory without
// publishing it. A dead holder's lock is released by the kernel at once.
//
// Size. The entries' bytes are capped (CacheLimits::max_bytes, $TWELL_CACHE_MAX_BYTES, default 2 GiB):
// after each publish, the least recently used entries (by mtime, which every disk hit touches) are
// evicted, each with its lock file, until the total fits; an entry whose lock another process holds
// (loading it under the lock, or writing it) is skipped, and so is the entry just published (the cap can
// be exceeded by that one entry alone when it is larger than the cap). A reader that opened an entry
// before it was evicted keeps reading it (POSIX unlink semantics). The same sweep removes lock files
// without an entry that are older than kStaleAge and not held. A lowered cap applies at the next publish.
//
// Temporaries. A process killed between writing its temporary and the rename leaves it behind: when the
// cache opens (writable) and after each publish, temporaries older than kStaleAge whose key's lock is
// free are removed (a writer holds its key's lock until its rename).
//
// Reading needs no write access: a read-only directory serves its valid entries, and kernels missing
// from it are compiled and kept in memory. A failure on one key's files (lock, publish) affects only
// that key; only the directory itself disappearing turns the disk cache off.
//
// Tools: scan(), validate_file(), remove_key() and clear() work on a directory without opening a cache
// (`twellc cache list|stats|clear|verify`).
#pragma once
#include <atomic>
#include <chrono>
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
  uint64_t evicted_entries = 0;  // entries this cache removed to keep the directory under CacheLimits::max_bytes
  uint64_t removed_temporaries = 0;  // stale temporaries this cache removed
  uint64_t lock_timeouts = 0;    // keys compiled in memory because their lock stayed held past lock_timeout
};

// The limits of the on-disk cache.
struct CacheLimits {
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{2} << 30;  // 2 GiB
  static constexpr std::chrono::milliseconds kDefaultLockTimeout{30'000};
  // Total bytes of the entry files (<key>.twk) in the directory; above it, least recently used entries
  // are evicted after each publish.
  uint64_t max_bytes = kDefaultMaxBytes;
  // Longest wait for one key's lock (another process compiling or publishing that key); then the kernel
  // is compiled in memory and not published. Zero: one try, no wait.
  std::chrono::milliseconds lock_timeout = kDefaultLockTimeout;

  // From the environment:
  //   $TWELL_CACHE_MAX_BYTES      bytes: digits, optionally followed by K, M or G (KiB, MiB, GiB);
  //                               unset, empty or 0: kDefaultMaxBytes.
  //   $TWELL_CACHE_LOCK_TIMEOUT_S seconds: a non-negative decimal number (fractions allowed, at most
  //                               1e6); unset or empty: kDefaultLockTimeout.
  // An invalid value takes the default, with one warning per variable and process on stderr naming the
  // variable, what was expected and what was given. Never throws.
  static CacheLimits from_env();
};

class KernelCache {
 public:
  static constexpr uint32_t kFormatVersion = 1;
  // A temporary or an unheld lock file without an entry older than this is left over by a dead process.
  static constexpr std::chrono::minutes kStaleAge{10};

  // `dir` empty: memory only. Otherwise the directory is created if needed and probed for writing. If it
  // cannot be created or read the cache continues in memory only; if it is read-only its entries are
  // still used and new kernels are kept in memory only; if writing one key's files fails later, that key
  // is kept in memory only. Each of these warns once on stderr for this cache: compiles never fail
  // because of the disk cache. A writable directory's stale temporaries are removed here.
  explicit KernelCache(std::filesystem::path dir, CacheLimits limits = CacheLimits::from_env());
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
    // A damaged entry was found at the key's path (counted in stats().corrupt_entries): this call
    // compiled its replacement (hit is Miss), published where the directory is writable.
    bool corrupt = false;
  };

  // The entry for `key`: from memory; else from disk (then kept in memory); else from compile(), which
  // is then published to memory and disk. Thread-safe: concurrent calls for one key run compile() once
  // (the others wait and get a Memory hit); across processes sharing the directory, the per-key lock
  // makes the later process wait (at most limits().lock_timeout) and load the earlier one's entry. An
  // exception from compile() propagates and caches nothing. Throws Error(InvalidArgument) for a key that
  // is empty, longer than 128 characters or has characters outside [0-9A-Za-z_-] (keys become file names).
  Result get_or_compile(const std::string& key, const std::function<CacheEntry()>& compile);

  CacheStats stats() const;
  const CacheLimits& limits() const noexcept { return limits_; }
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

  // ---- A cache directory without a cache object (twellc cache) ----

  // One file of a cache directory, as scan() finds it.
  struct File {
    enum class Kind { Entry, Lock, Temporary };
    Kind kind = Kind::Entry;
    std::string key;  // the key its name holds; "" for a temporary whose name holds none
    std::filesystem::path path;
    uint64_t bytes = 0;  // st_size
    // mtime: for an entry, its publication or last disk hit (the LRU order of eviction).
    std::chrono::system_clock::time_point modified;
    bool regular = true;  // false: something else (FIFO, link, directory...) at the path
  };
  // The entries (<key>.twk), lock files (<key>.lock) and temporaries (.<stem>.<...>.tmp) of `dir`,
  // sorted by path; other names are ignored. Opens no file and follows no link (lstat). Throws
  // Error(NotFound) when `dir` does not exist, Error(Io) when it is not a directory or cannot be read.
  static std::vector<File> scan(const std::filesystem::path& dir);

  // Validates the entry file at `path` for `key` with the checks the loader applies: "" when valid, else
  // what is wrong in one phrase ("truncated: ...", "checksum mismatch ...", "belongs to another key ...",
  // "not a regular file ...", "cannot open ...: <errno text>"). Never blocks (a FIFO is not opened for
  // reading) and does not touch the file's mtime. `entry`, when given, receives a valid entry's contents.
  static std::string validate_file(const std::filesystem::path& path, std::string_view key,
                                   CacheEntry* entry = nullptr);

  enum class Removal {
    Removed,       // the key's entry (if any) and lock file are gone
    Kept,          // only_if_damaged and the entry is valid: nothing removed
    InUse,         // another process holds the key's lock: nothing removed
    NotRemovable,  // a directory is at the entry path: left alone (the lock file is removed)
  };
  // Removes <dir>/<key>.twk and <dir>/<key>.lock while holding the key's lock, taken without waiting.
  // only_if_damaged: keeps an entry that validates (one republished since it was checked). Throws
  // Error(InvalidArgument) for a key that is not a file name (see get_or_compile), Error(Io) when the
  // lock file cannot be opened or locked for another reason than being held (a read-only directory).
  static Removal remove_key(const std::filesystem::path& dir, const std::string& key, bool only_if_damaged = false);

  struct Cleared {
    uint64_t entries = 0, entry_bytes = 0, temporaries = 0, locks = 0;
    uint64_t keys_in_use = 0;  // keys whose lock another process held: their files were left in place
  };
  // Removes every entry, temporary and lock file of `dir` (key by key, each while holding its lock taken
  // without waiting; keys in use are skipped). Directories and other names are left alone. Throws like
  // scan() and remove_key().
  static Cleared clear(const std::filesystem::path& dir);

 private:
  struct Slot;
  std::shared_ptr<Slot> slot(const std::string& key);
  void disable_disk(const std::string& why);
  void warn_not_published(const std::string& why);
  void key_failed(const std::string& why);
  // Removes stale temporaries and, when `evict`, stale lock files without an entry and least recently
  // used entries above limits_.max_bytes (never `protect`'s). Failures are ignored: the next sweep retries.
  void sweep(const std::string& protect, bool evict);

  std::filesystem::path dir_;
  CacheLimits limits_;
  std::atomic<bool> persistent_{false};
  std::atomic<bool> writable_{false};
  std::string read_only_reason_;  // why a persistent directory is not writable (set by the constructor)
  std::once_flag warned_;          // the disk cache is off
  std::once_flag warned_publish_;  // some kernels are not published
  mutable std::mutex mutex_;  // guards slots_
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, misses_{0}, corrupt_entries_{0};
  std::atomic<uint64_t> evicted_entries_{0}, removed_temporaries_{0}, lock_timeouts_{0};
};

}  // namespace twell::detail
