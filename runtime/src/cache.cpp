#include "cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "bounded_read.h"
#include "twell/error.h"

// Header-only xxHash: nothing to link, and the hash functions inline into their single caller.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace twell::detail {
namespace {

constexpr char kMagic[8] = {'T', 'W', 'E', 'L', 'L', 'K', '0', '1'};
constexpr size_t kHeaderBytes = 48;
constexpr size_t kMaxKeyLength = 128;

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_;
};

std::string errnoText(int err) { return std::strerror(err); }

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint64_t getLE(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint64_t payloadChecksum(std::string_view ptx, const char* cubin, size_t cubin_size) {
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  XXH64_update(&state, ptx.data(), ptx.size());
  XXH64_update(&state, cubin, cubin_size);
  return XXH64_digest(&state);
}

uint64_t keyHash(std::string_view key) { return XXH64(key.data(), key.size(), 0); }

std::string serialize(const CacheEntry& entry, std::string_view key) {
  std::string out;
  out.reserve(kHeaderBytes + entry.ptx.size() + entry.cubin.size());
  out.append(kMagic, sizeof(kMagic));
  putU32(out, KernelCache::kFormatVersion);
  putU32(out, kHeaderBytes);
  putU64(out, entry.ptx.size());
  putU64(out, entry.cubin.size());
  putU64(out, payloadChecksum(entry.ptx, entry.cubin.data(), entry.cubin.size()));
  putU64(out, keyHash(key));
  out += entry.ptx;
  out.append(entry.cubin.data(), entry.cubin.size());
  return out;
}

// What is wrong with `bytes` as the .twk file of `key` ("" when valid); a valid entry goes to `out`.
std::string parse(const std::string& bytes, std::string_view key, CacheEntry* out) {
  if (bytes.size() < kHeaderBytes)
    return "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
           "-byte header";
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return "not a twell cache entry (no TWELLK01 magic)";
  const char* h = bytes.data();
  if (const uint64_t version = getLE(h + 8, 4); version != KernelCache::kFormatVersion)
    return "format version " + std::to_string(version) + ", expected " + std::to_string(KernelCache::kFormatVersion);
  if (const uint64_t header = getLE(h + 12, 4); header != kHeaderBytes)
    return "header size " + std::to_string(header) + ", expected " + std::to_string(kHeaderBytes);
  const uint64_t ptx_size = getLE(h + 16, 8), cubin_size = getLE(h + 24, 8);
  const uint64_t payload = bytes.size() - kHeaderBytes;
  if (ptx_size > payload || cubin_size != payload - ptx_size)
    return "truncated or extended: the header says " + std::to_string(ptx_size) + " PTX + " +
           std::to_string(cubin_size) + " cubin bytes, the file has " + std::to_string(payload) + " payload bytes";
  if (getLE(h + 40, 8) != keyHash(key)) return "belongs to another key (renamed or copied from another entry)";
  const std::string_view ptx(h + kHeaderBytes, ptx_size);
  const char* cubin = h + kHeaderBytes + ptx_size;
  if (getLE(h + 32, 8) != payloadChecksum(ptx, cubin, cubin_size)) return "payload checksum mismatch (damaged contents)";
  if (out != nullptr) *out = CacheEntry{std::string(ptx), std::vector<char>(cubin, cubin + cubin_size)};
  return {};
}

enum class Read { Ok, Missing, Corrupt };

// Larger than any kernel's PTX and cubin together: a bigger file is not an entry (and is not read).
constexpr int64_t kMaxEntryBytes = int64_t{1} << 30;

const char* fileType(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// Reads and validates <key>.twk. Never blocks and never follows a link: anything at the path that is
// not a regular file (FIFO, socket, device, directory, symbolic link) is Corrupt without being opened
// for reading (a FIFO would block open() forever). A path that cannot be opened for another reason
// (permissions) is treated as missing. `touch`: a valid entry's mtime is set to now (its last use, the
// LRU order of eviction; failing to, in a read-only directory, is harmless). `problem` gets what is wrong.
Read readEntry(const std::filesystem::path& path, std::string_view key, CacheEntry* out, bool touch,
               std::string* problem = nullptr) {
  auto fail = [&](Read r, std::string why) {
    if (problem != nullptr) *problem = std::move(why);
    return r;
  };
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return fail(Read::Missing, "cannot read it: " + errnoText(errno));
  if (!S_ISREG(st.st_mode)) return fail(Read::Corrupt, std::string("not a regular file: ") + fileType(st.st_mode));
  // O_NONBLOCK | O_NOFOLLOW (bounded_read.h): the path may have been replaced by a FIFO or a link since lstat.
  Fd fd(open_for_bounded_read(path));
  if (!fd) {
    const int err = errno;
    return fail(err == ELOOP ? Read::Corrupt : Read::Missing, "cannot open it: " + errnoText(err));
  }
  const BoundedRead read = read_bounded(fd.get(), kMaxEntryBytes);
  switch (read.status) {
    case BoundedRead::Status::Read:
      break;
    case BoundedRead::Status::CannotStat:
      return fail(Read::Missing, "cannot stat it: " + errnoText(read.error));
    case BoundedRead::Status::NotRegular:
      return fail(Read::Corrupt, std::string("not a regular file: ") + fileType(read.mode));
    case BoundedRead::Status::TooLarge:
      return fail(Read::Corrupt, "larger than any entry (" + std::to_string(read.size) + " bytes)");
  }
  if (std::string why = parse(read.bytes, key, out); !why.empty()) return fail(Read::Corrupt, std::move(why));
  if (touch) ::futimens(fd.get(), nullptr);
  return Read::Ok;
}

// Removes what is at `path` so that a regular file can take its place: anything but a directory (a
// directory is someone's data; publishing over it then fails and is reported).
void removeNonDirectory(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(path.c_str());
}

bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A name no other writer uses at the same time: pid + thread id + a per-process counter.
std::filesystem::path tempPath(const std::filesystem::path& dir, std::string_view stem) {
  static std::atomic<uint64_t> counter{0};
  std::string name = ".";
  name.append(stem);
  for (uint64_t part : {static_cast<uint64_t>(::getpid()), static_cast<uint64_t>(::gettid()), counter.fetch_add(1)})
    name.append(".").append(std::to_string(part));
  return dir / name.append(".tmp");
}

// Writes `bytes` to `target` atomically. Returns an empty string, or what failed.
std::string publish(const std::filesystem::path& dir, const std::filesystem::path& target, std::string_view stem,
                    const std::string& bytes) {
  const std::filesystem::path temp = tempPath(dir, stem);
  std::string error;
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) return "cannot create " + temp.string() + ": " + errnoText(errno);
    if (!writeAll(fd.get(), bytes.data(), bytes.size()))
      error = "cannot write " + temp.string() + ": " + errnoText(errno);
    else if (::fsync(fd.get()) != 0)
      error = "cannot fsync " + temp.string() + ": " + errnoText(errno);
  }
  if (error.empty() && ::rename(temp.c_str(), target.c_str()) != 0)
    error = "cannot rename " + temp.string() + " to " + target.string() + ": " + errnoText(errno);
  if (!error.empty()) {
    ::unlink(temp.c_str());
    return error;
  }
  // Make the rename itself durable; failing to is not worth giving up the disk cache for.
  if (Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) ::fsync(d.get());
  return {};
}

// An exclusive flock on a key's lock file, released by unlock() or on scope exit (also when the process
// dies). The lock file is opened without blocking and without following links; anything at its path that
// is not a regular file (FIFO, socket, device, link) is replaced first; a directory there is a failure.
// Lock files are removed only by their holder (remove_file()), so after each successful flock the lock
// checks that the file it locked is still the one at the path, and otherwise starts over on the new one:
// two processes never both hold "the" lock.
class KeyLock {
 public:
  enum class State { Held, Unavailable, Failed };  // Unavailable: still held by another after `wait`

  // Polls flock(LOCK_NB) with short sleeps for at most `wait` (zero: one try). `on_slow_wait` runs once
  // if the wait lasts kSlowWait.
  KeyLock(const std::filesystem::path& path, std::chrono::milliseconds wait,
          const std::function<void()>& on_slow_wait = {})
      : path_(path) {
    using Clock = std::chrono::steady_clock;
    constexpr std::chrono::seconds kSlowWait{1};
    constexpr std::chrono::milliseconds kLongestSleep{20};
    const Clock::time_point start = Clock::now(), deadline = start + wait;
    std::chrono::milliseconds sleep{1};
    bool said = false;
    for (;;) {
      if (!open()) return;
      for (;;) {
        if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) break;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) {
          fail("cannot lock " + path_.string() + ": " + errnoText(errno));
          return;
        }
        const Clock::time_point now = Clock::now();
        if (now >= deadline) {
          state_ = State::Unavailable;
          fd_.reset();
          return;
        }
        if (!said && on_slow_wait && now - start >= kSlowWait) {
          said = true;
          on_slow_wait();
        }
        std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - now));
        sleep = std::min(sleep * 2, kLongestSleep);
      }
      struct stat locked {}, current {};
      if (::fstat(fd_.get(), &locked) == 0 && ::lstat(path_.c_str(), &current) == 0 &&
          locked.st_dev == current.st_dev && locked.st_ino == current.st_ino) {
        state_ = State::Held;
        return;
      }
      // Its holder removed the file while we waited: the lock we got guards nothing.
      fd_.reset();
    }
  }
  State state() const { return state_; }
  // Why the lock is Failed.
  const std::string& error() const { return error_; }
  // Releases the lock (keeping the file).
  void unlock() { fd_.reset(); }
  // Unlinks the lock file while holding it, then releases it.
  void remove_file() {
    if (state_ == State::Held && fd_) ::unlink(path_.c_str());
    fd_.reset();
  }

 private:
  bool open() {
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      if (S_ISDIR(st.st_mode)) return fail("cannot use " + path_.string() + " as a lock file: it is a directory");
      ::unlink(path_.c_str());
    }
    fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644));
    // Another user's lock file (0644): flock needs no write access.
    if (!fd_ && errno == EACCES) fd_.reset(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) return fail("cannot open " + path_.string() + ": " + errnoText(errno));
    if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode))
      return fail("cannot use " + path_.string() + " as a lock file: not a regular file");
    return true;
  }
  bool fail(std::string why) {
    state_ = State::Failed;
    error_ = std::move(why);
    fd_.reset();
    return false;
  }

  std::filesystem::path path_;
  Fd fd_;
  State state_ = State::Failed;
  std::string error_;
};

bool validKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyLength) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

void appendField(std::string& out, std::string_view field) {
  putU64(out, field.size());
  out.append(field);
}

const char* nonEmptyEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

// "123", "64K", "512M", "2G" (powers of 1024), or nothing when malformed or above 2^64 - 1.
std::optional<uint64_t> parseBytes(std::string_view v) {
  uint64_t n = 0;
  size_t i = 0;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i) {
    const uint64_t digit = static_cast<uint64_t>(v[i] - '0');
    if (n > (UINT64_MAX - digit) / 10) return std::nullopt;
    n = n * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  int shift = 0;
  if (i < v.size()) {
    switch (v[i++]) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: return std::nullopt;
    }
  }
  if (i != v.size() || (shift > 0 && n > (UINT64_MAX >> shift))) return std::nullopt;
  return n << shift;
}

std::filesystem::path lockPath(const std::filesystem::path& dir, std::string_view key) {
  return dir / (std::string(key) + ".lock");
}

std::chrono::system_clock::time_point modifiedTime(const struct stat& st) {
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

using File = KernelCache::File;

// The kind and key of a name in a cache directory, or nothing for names the cache does not own.
std::optional<std::pair<File::Kind, std::string>> classify(std::string_view name) {
  auto strip = [&](std::string_view suffix) -> std::optional<std::string_view> {
    if (name.size() <= suffix.size() || name.substr(name.size() - suffix.size()) != suffix) return std::nullopt;
    return name.substr(0, name.size() - suffix.size());
  };
  if (name.size() > 1 && name[0] == '.') {
    // .<stem>.<pid>.<tid>.<n>.tmp (tempPath): the stem is the key, or "probe".
    if (std::optional<std::string_view> rest = strip(".tmp")) {
      const std::string_view stem = rest->substr(1, rest->find('.', 1) - 1);
      return std::pair{File::Kind::Temporary, validKey(stem) ? std::string(stem) : std::string()};
    }
    return std::nullopt;
  }
  if (std::optional<std::string_view> key = strip(".twk"); key && validKey(*key))
    return std::pair{File::Kind::Entry, std::string(*key)};
  if (std::optional<std::string_view> key = strip(".lock"); key && validKey(*key))
    return std::pair{File::Kind::Lock, std::string(*key)};
  return std::nullopt;
}

// The cache's files in `dir` (only its temporaries when `temporaries_only`), sorted by path. Throws
// Error(NotFound) when `dir` does not exist, Error(Io) when it cannot be read.
std::vector<File> scanDir(const std::filesystem::path& dir, bool temporaries_only) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::NotFound, "kernel cache directory " + dir.string() + " does not exist");
    throw Error(ErrorCode::Io, "cannot read the kernel cache directory " + dir.string() + ": " + errnoText(err));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> close(d, ::closedir);
  std::vector<File> files;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0)
        throw Error(ErrorCode::Io, "cannot read the kernel cache directory " + dir.string() + ": " + errnoText(errno));
      break;
    }
    std::optional<std::pair<File::Kind, std::string>> what = classify(e->d_name);
    if (!what || (temporaries_only && what->first != File::Kind::Temporary)) continue;
    File f;
    f.kind = what->first;
    f.key = std::move(what->second);
    f.path = dir / e->d_name;
    struct stat st {};
    if (::lstat(f.path.c_str(), &st) != 0) continue;  // removed since readdir
    f.bytes = static_cast<uint64_t>(st.st_size);
    f.modified = modifiedTime(st);
    f.regular = S_ISREG(st.st_mode);
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const File& x, const File& y) { return x.path < y.path; });
  return files;
}

// Removes the stale temporaries among `files` (a writer holds its key's lock from before it creates its
// temporary until after its rename, so one whose key's lock is free belongs to nobody). Returns how many.
uint64_t removeStaleTemporaries(const std::filesystem::path& dir, const std::vector<File>& files) {
  const auto now = std::chrono::system_clock::now();
  uint64_t removed = 0;
  for (const File& f : files) {
    if (f.kind != File::Kind::Temporary || now - f.modified < KernelCache::kStaleAge) continue;
    if (f.key.empty()) {
      removed += ::unlink(f.path.c_str()) == 0;
      continue;
    }
    KeyLock lock(lockPath(dir, f.key), std::chrono::milliseconds(0));
    if (lock.state() != KeyLock::State::Held) continue;
    removed += ::unlink(f.path.c_str()) == 0;
    // Taking the lock may have created its file: keep it only beside an entry.
    struct stat st {};
    if (::lstat((dir / (f.key + ".twk")).c_str(), &st) != 0) lock.remove_file();
  }
  return removed;
}

}  // namespace

struct KernelCache::Slot {
  std::mutex mutex;  // held while this key is looked up on disk or compiled
  std::shared_ptr<const CacheEntry> entry;
};

CacheLimits CacheLimits::from_env() {
  CacheLimits limits;
  if (const char* v = nonEmptyEnv("TWELL_CACHE_MAX_BYTES")) {
    if (std::optional<uint64_t> bytes = parseBytes(v); !bytes) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "twell: warning: $TWELL_CACHE_MAX_BYTES: expected a number of bytes (digits, optionally followed "
                     "by K, M or G), got '%s'; using the default %llu bytes (2 GiB)\n",
                     v, static_cast<unsigned long long>(kDefaultMaxBytes));
      });
    } else if (*bytes != 0) {
      limits.max_bytes = *bytes;
    }
  }
  if (const char* v = nonEmptyEnv("TWELL_CACHE_LOCK_TIMEOUT_S")) {
    char* end = nullptr;
    const double seconds = std::strtod(v, &end);
    const bool starts_as_number = std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '.';
    if (!starts_as_number || end == v || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 1e6) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "twell: warning: $TWELL_CACHE_LOCK_TIMEOUT_S: expected a number of seconds in 0..1000000, got "
                     "'%s'; using the default %lld s\n",
                     v, static_cast<long long>(kDefaultLockTimeout.count() / 1000));
      });
    } else {
      limits.lock_timeout = std::chrono::milliseconds(std::llround(seconds * 1000));
    }
  }
  return limits;
}

KernelCache::KernelCache(std::filesystem::path dir, CacheLimits limits) : dir_(std::move(dir)), limits_(limits) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    disable_disk("cannot create the directory: " + ec.message());
    return;
  }
  if (!std::filesystem::is_directory(dir_, ec)) {
    disable_disk("not a directory");
    return;
  }
  if (::access(dir_.c_str(), R_OK | X_OK) != 0) {
    disable_disk("cannot read it: " + errnoText(errno));
    return;
  }
  persistent_.store(true);
  // A read-only directory (a shared, pre-populated cache) still serves its entries.
  const std::filesystem::path probe = tempPath(dir_, "probe");
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) {
    // Warned about when a kernel missing from it is compiled (a complete read-only cache is fine).
    read_only_reason_ = "cannot create a file in it (" + errnoText(errno) +
                        "): using its entries, caching new kernels in memory only";
    return;
  }
  ::unlink(probe.c_str());
  writable_.store(true);
  sweep({}, false);
}

KernelCache::~KernelCache() = default;

std::filesystem::path KernelCache::default_dir() {
  if (const char* dir = nonEmptyEnv("TWELL_CACHE_DIR")) return dir;
  if (const char* xdg = nonEmptyEnv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/')
    return std::filesystem::path(xdg) / "twell";
  const char* home = nonEmptyEnv("HOME");
  if (home == nullptr)
    if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr && pw->pw_dir[0] != '\0')
      home = pw->pw_dir;
  if (home == nullptr) return {};
  return std::filesystem::path(home) / ".cache" / "twell";
}

std::string KernelCache::make_key(std::string_view source, std::string_view nvrtc_version,
                                 const std::vector<std::string>& options, std::string_view arch,
                                 std::string_view twell_version) {
  std::string fields;
  fields.reserve(source.size() + 256);
  appendField(fields, "twell-kernel-key-1");
  appendField(fields, source);
  appendField(fields, nvrtc_version);
  putU64(fields, options.size());
  for (const std::string& option : options) appendField(fields, option);
  appendField(fields, arch);
  appendField(fields, twell_version);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(fields.data(), fields.size()));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key;
  for (unsigned char byte : canonical.digest) {
    key.push_back(kHex[byte >> 4]);
    key.push_back(kHex[byte & 15]);
  }
  return key;
}

std::filesystem::path KernelCache::entry_path(std::string_view key) const {
  return dir_ / (std::string(key) + ".twk");
}

std::shared_ptr<KernelCache::Slot> KernelCache::slot(const std::string& key) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Slot>& s = slots_[key];
  if (!s) s = std::make_shared<Slot>();
  return s;
}

void KernelCache::drop_memory() {
  std::lock_guard lock(mutex_);
  slots_.clear();
}

void KernelCache::disable_disk(const std::string& why) {
  persistent_.store(false);
  writable_.store(false);
  std::call_once(warned_, [&] {
    std::fprintf(stderr, "twell: warning: kernel cache directory %s: %s; caching kernels in memory only\n",
                 dir_.c_str(), why.c_str());
  });
}

void KernelCache::warn_not_published(const std::string& why) {
  std::call_once(warned_publish_, [&] {
    std::fprintf(stderr, "twell: warning: kernel cache directory %s: %s\n", dir_.c_str(), why.c_str());
  });
}

void KernelCache::key_failed(const std::string& why) {
  // Only the directory itself going away ends the disk cache; a failure on one key's files (a lock path
  // that is a directory, a full disk, a file someone else owns) leaves the other keys' entries in use.
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    disable_disk(why);
    return;
  }
  warn_not_published(why + "; kernels whose files cannot be written are cached in memory only, the other entries "
                         "are still used");
}

void KernelCache::sweep(const std::string& protect, bool evict) {
  std::vector<File> files;
  try {
    files = scanDir(dir_, !evict);
  } catch (const Error&) {
    return;
  }
  removed_temporaries_.fetch_add(removeStaleTemporaries(dir_, files), std::memory_order_relaxed);
  if (!evict) return;

  const auto now = std::chrono::system_clock::now();
  std::unordered_map<std::string, const File*> entries;
  uint64_t total = 0;
  for (const File& f : files)
    if (f.kind == File::Kind::Entry) {
      entries.emplace(f.key, &f);
      if (f.regular) total += f.bytes;
    }
  // Lock files left by keys that never got an entry (a failed compile, a key kept in memory).
  for (const File& f : files) {
    if (f.kind != File::Kind::Lock || entries.count(f.key) != 0 || now - f.modified < kStaleAge) continue;
    KeyLock lock(f.path, std::chrono::milliseconds(0));
    struct stat st {};
    if (lock.state() == KeyLock::State::Held && ::lstat(entry_path(f.key).c_str(), &st) != 0) lock.remove_file();
  }
  if (total <= limits_.max_bytes) return;

  std::vector<const File*> order;
  for (const auto& [key, f] : entries)
    if (f->regular && key != protect) order.push_back(f);
  std::sort(order.begin(), order.end(), [](const File* x, const File* y) {
    return x->modified != y->modified ? x->modified < y->modified : x->path < y->path;
  });
  for (const File* f : order) {
    if (total <= limits_.max_bytes) break;
    // Held by another: it is being loaded under the lock or rewritten; leave it.
    KeyLock lock(lockPath(dir_, f->key), std::chrono::milliseconds(0));
    if (lock.state() != KeyLock::State::Held) continue;
    struct stat st {};
    if (::lstat(f->path.c_str(), &st) != 0) {  // evicted by another process meanwhile
      total -= f->bytes;
      lock.remove_file();
      continue;
    }
    // Used (a disk hit touched it) or republished since the scan: no longer the least recently used.
    if (!S_ISREG(st.st_mode) || modifiedTime(st) != f->modified) continue;
    if (::unlink(f->path.c_str()) != 0) continue;
    total -= f->bytes;
    evicted_entries_.fetch_add(1, std::memory_order_relaxed);
    lock.remove_file();
  }
}

KernelCache::Result KernelCache::get_or_compile(const std::string& key, const std::function<CacheEntry()>& compile) {
  if (!validKey(key))
    throw Error(ErrorCode::InvalidArgument,
                "KernelCache::get_or_compile: key: expected 1.." + std::to_string(kMaxKeyLength) +
                    " characters from [0-9A-Za-z_-], got \"" + key + "\"");
  std::shared_ptr<Slot> s = slot(key);
  std::lock_guard slot_lock(s->mutex);
  if (s->entry) {
    memory_hits_.fetch_add(1, std::memory_order_relaxed);
    return {s->entry, CacheHit::Memory};
  }

  bool corrupt = false;
  auto keep = [&](CacheEntry&& entry, CacheHit hit) -> Result {
    s->entry = std::make_shared<const CacheEntry>(std::move(entry));
    if (hit == CacheHit::Disk) disk_hits_.fetch_add(1, std::memory_order_relaxed);
    return {s->entry, hit, corrupt};
  };
  // Compiles and keeps the kernel in memory only (the damaged entry, if any, counted but left in place).
  auto compileInMemory = [&]() -> Result {
    if (corrupt) corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
    misses_.fetch_add(1, std::memory_order_relaxed);
    return keep(compile(), CacheHit::Miss);
  };

  if (!persistent()) return compileInMemory();

  const std::filesystem::path path = entry_path(key);
  CacheEntry loaded;
  // Without the lock first (and without write access): entries appear by rename, so a reader sees a
  // whole file or none.
  const Read first = readEntry(path, key, &loaded, true);
  if (first == Read::Ok) return keep(std::move(loaded), CacheHit::Disk);
  corrupt = first == Read::Corrupt;

  // Publishing needs the directory writable and the key's lock; without them the kernel is compiled
  // and kept in memory.
  if (!writable()) {
    if (!read_only_reason_.empty()) warn_not_published(read_only_reason_);
    return compileInMemory();
  }
  const std::filesystem::path lock_path = lockPath(dir_, key);
  const double timeout_s = static_cast<double>(limits_.lock_timeout.count()) / 1000;
  KeyLock lock(lock_path, limits_.lock_timeout, [&] {
    std::fprintf(stderr,
                 "twell: kernel cache: waiting for the lock %s: another process is compiling or publishing this "
                 "kernel (waiting at most %.1f s, $TWELL_CACHE_LOCK_TIMEOUT_S)\n",
                 lock_path.c_str(), timeout_s);
  });
  if (lock.state() == KeyLock::State::Unavailable) {
    lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
    std::fprintf(stderr,
                 "twell: warning: kernel cache: the lock %s is still held after %.1f s (is the process holding it "
                 "stopped?); compiling kernel %s in memory without publishing it\n",
                 lock_path.c_str(), timeout_s, key.c_str());
    return compileInMemory();
  }
  if (lock.state() == KeyLock::State::Failed) {
    key_failed(lock.error());
    return compileInMemory();
  }
  // Another process may have published (or removed the damaged entry) while we waited for the lock.
  const Read second = readEntry(path, key, &loaded, true);
  corrupt = second == Read::Corrupt;
  if (second == Read::Ok) return keep(std::move(loaded), CacheHit::Disk);
  if (corrupt) {
    corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
    removeNonDirectory(path);
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  CacheEntry compiled = compile();
  const std::string error = publish(dir_, path, key, serialize(compiled, key));
  lock.unlock();
  if (!error.empty())
    key_failed(error);
  else
    sweep(key, true);
  return keep(std::move(compiled), CacheHit::Miss);
}

CacheStats KernelCache::stats() const {
  return {memory_hits_.load(),     disk_hits_.load(),           misses_.load(),       corrupt_entries_.load(),
          evicted_entries_.load(), removed_temporaries_.load(), lock_timeouts_.load()};
}

std::vector<KernelCache::File> KernelCache::scan(const std::filesystem::path& dir) { return scanDir(dir, false); }

std::string KernelCache::validate_file(const std::filesystem::path& path, std::string_view key, CacheEntry* entry) {
  std::string problem;
  return readEntry(path, key, entry, false, &problem) == Read::Ok ? std::string() : problem;
}

KernelCache::Removal KernelCache::remove_key(const std::filesystem::path& dir, const std::string& key,
                                             bool only_if_damaged) {
  if (!validKey(key))
    throw Error(ErrorCode::InvalidArgument,
                "KernelCache::remove_key: key: expected 1.." + std::to_string(kMaxKeyLength) +
                    " characters from [0-9A-Za-z_-], got \"" + key + "\"");
  KeyLock lock(lockPath(dir, key), std::chrono::milliseconds(0));
  if (lock.state() == KeyLock::State::Unavailable) return Removal::InUse;
  if (lock.state() == KeyLock::State::Failed) throw Error(ErrorCode::Io, "KernelCache::remove_key: " + lock.error());
  const std::filesystem::path entry = dir / (key + ".twk");
  struct stat st {};
  if (::lstat(entry.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      lock.remove_file();
      return Removal::NotRemovable;
    }
    if (only_if_damaged && validate_file(entry, key).empty()) return Removal::Kept;
    if (::unlink(entry.c_str()) != 0 && errno != ENOENT)
      throw Error(ErrorCode::Io, "KernelCache::remove_key: cannot remove " + entry.string() + ": " + errnoText(errno));
  }
  lock.remove_file();
  return Removal::Removed;
}

KernelCache::Cleared KernelCache::clear(const std::filesystem::path& dir) {
  Cleared cleared;
  std::map<std::string, std::vector<const File*>> by_key;
  const std::vector<File> files = scan(dir);
  for (const File& f : files) {
    if (!f.key.empty())
      by_key[f.key].push_back(&f);
    else if (::unlink(f.path.c_str()) == 0)  // a temporary without a key (the writability probe)
      ++cleared.temporaries;
  }
  for (const auto& [key, group] : by_key) {
    KeyLock lock(lockPath(dir, key), std::chrono::milliseconds(0));
    if (lock.state() == KeyLock::State::Unavailable) {
      ++cleared.keys_in_use;
      continue;
    }
    if (lock.state() == KeyLock::State::Failed) throw Error(ErrorCode::Io, "KernelCache::clear: " + lock.error());
    bool had_lock_file = false;
    for (const File* f : group) {
      switch (f->kind) {
        case File::Kind::Lock:
          had_lock_file = true;
          break;
        case File::Kind::Entry:
          if (::unlink(f->path.c_str()) == 0) {  // never a directory
            ++cleared.entries;
            if (f->regular) cleared.entry_bytes += f->bytes;
          }
          break;
        case File::Kind::Temporary:
          cleared.temporaries += ::unlink(f->path.c_str()) == 0;
          break;
      }
    }
    lock.remove_file();
    cleared.locks += had_lock_file;
  }
  return cleared;
}

}  // namespace twell::detail
