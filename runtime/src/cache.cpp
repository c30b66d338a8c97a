#include "cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

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

// The entry in `bytes` (a whole .twk file), or nothing if any check fails.
std::optional<CacheEntry> parse(const std::string& bytes, std::string_view key) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  const char* h = bytes.data();
  if (getLE(h + 8, 4) != KernelCache::kFormatVersion || getLE(h + 12, 4) != kHeaderBytes) return std::nullopt;
  const uint64_t ptx_size = getLE(h + 16, 8), cubin_size = getLE(h + 24, 8);
  const uint64_t payload = bytes.size() - kHeaderBytes;
  if (ptx_size > payload || cubin_size != payload - ptx_size) return std::nullopt;
  if (getLE(h + 40, 8) != keyHash(key)) return std::nullopt;
  const std::string_view ptx(h + kHeaderBytes, ptx_size);
  const char* cubin = h + kHeaderBytes + ptx_size;
  if (getLE(h + 32, 8) != payloadChecksum(ptx, cubin, cubin_size)) return std::nullopt;
  return CacheEntry{std::string(ptx), std::vector<char>(cubin, cubin + cubin_size)};
}

enum class Read { Ok, Missing, Corrupt };

// Larger than any kernel's PTX and cubin together: a bigger file is not an entry (and is not read).
constexpr off_t kMaxEntryBytes = off_t{1} << 30;

// Reads and validates <key>.twk. Never blocks and never follows a link: anything at the path that is
// not a regular file (FIFO, socket, device, directory, symbolic link) is Corrupt without being opened
// for reading (a FIFO would block open() forever). A path that cannot be opened for another reason
// (permissions) is treated as missing.
Read readEntry(const std::filesystem::path& path, std::string_view key, CacheEntry& out) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Read::Missing;
  if (!S_ISREG(st.st_mode)) return Read::Corrupt;
  // O_NONBLOCK | O_NOFOLLOW: the path may have been replaced by a FIFO or a link since lstat.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return errno == ELOOP ? Read::Corrupt : Read::Missing;
  if (::fstat(fd.get(), &st) != 0) return Read::Missing;
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxEntryBytes) return Read::Corrupt;
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  std::optional<CacheEntry> entry = parse(bytes, key);
  if (!entry) return Read::Corrupt;
  out = std::move(*entry);
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

// An exclusive flock on <dir>/<key>.lock, released on scope exit (also when the process dies). The lock
// file is opened without blocking and without following links; anything at its path that is not a
// regular file (FIFO, socket, device, link) is replaced first. A directory there is an error.
class KeyLock {
 public:
  explicit KeyLock(const std::filesystem::path& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      if (S_ISDIR(st.st_mode)) {
        error_ = "cannot use " + path.string() + " as a lock file: it is a directory";
        return;
      }
      ::unlink(path.c_str());
    }
    fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644));
    // Another user's lock file (0644): flock needs no write access.
    if (!fd_ && errno == EACCES) fd_.reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) {
      error_ = "cannot open " + path.string() + ": " + errnoText(errno);
      return;
    }
    if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      error_ = "cannot use " + path.string() + " as a lock file: not a regular file";
      fd_.reset();
      return;
    }
    int r;
    do r = ::flock(fd_.get(), LOCK_EX);
    while (r != 0 && errno == EINTR);
    if (r != 0) error_ = "cannot lock " + path.string() + ": " + errnoText(errno);
  }
  // Empty when the lock is held.
  const std::string& error() const { return error_; }

 private:
  Fd fd_;
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

}  // namespace

struct KernelCache::Slot {
  std::mutex mutex;  // held while this key is looked up on disk or compiled
  std::shared_ptr<const CacheEntry> entry;
};

KernelCache::KernelCache(std::filesystem::path dir) : dir_(std::move(dir)) {
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

  auto keep = [&](CacheEntry&& entry, CacheHit hit) -> Result {
    s->entry = std::make_shared<const CacheEntry>(std::move(entry));
    if (hit == CacheHit::Disk) disk_hits_.fetch_add(1, std::memory_order_relaxed);
    return {s->entry, hit};
  };
  // Compiles and keeps the kernel in memory only.
  auto compileInMemory = [&]() -> Result {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return keep(compile(), CacheHit::Miss);
  };

  if (!persistent()) return compileInMemory();

  const std::filesystem::path path = entry_path(key);
  CacheEntry loaded;
  // Without the lock first (and without write access): entries appear by rename, so a reader sees a
  // whole file or none.
  const Read first = readEntry(path, key, loaded);
  if (first == Read::Ok) return keep(std::move(loaded), CacheHit::Disk);

  // Publishing needs the directory writable and the key's lock; without them the kernel is compiled
  // and kept in memory (the damaged entry, if any, counted but left in place).
  if (!writable()) {
    if (first == Read::Corrupt) corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
    if (!read_only_reason_.empty()) warn_not_published(read_only_reason_);
    return compileInMemory();
  }
  KeyLock lock(dir_ / (key + ".lock"));
  if (!lock.error().empty()) {
    if (first == Read::Corrupt) corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
    key_failed(lock.error());
    return compileInMemory();
  }
  // Another process may have published while we waited for the lock.
  switch (readEntry(path, key, loaded)) {
    case Read::Ok:
      return keep(std::move(loaded), CacheHit::Disk);
    case Read::Corrupt:
      corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
      removeNonDirectory(path);
      break;
    case Read::Missing:
      break;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  CacheEntry compiled = compile();
  if (std::string error = publish(dir_, path, key, serialize(compiled, key)); !error.empty()) key_failed(error);
  return keep(std::move(compiled), CacheHit::Miss);
}

CacheStats KernelCache::stats() const {
  return {memory_hits_.load(), disk_hits_.load(), misses_.load(), corrupt_entries_.load()};
}

}  // namespace twell::detail
