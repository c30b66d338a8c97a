// The kernel cache without a GPU: hits, keys, corrupt entries, fallback to memory, concurrency.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <future>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache.h"
#include "twell/error.h"

namespace {

using twell::Error;
using twell::ErrorCode;
using namespace twell::detail;
namespace fs = std::filesystem;

// A fresh directory, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "twell-cache-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

CacheEntry sampleEntry(const std::string& tag = "a") {
  CacheEntry e;
  e.ptx = ".version 9.0\n.target sm_90a\n// " + tag + "\n";
  e.cubin = {'\x7f', 'E', 'L', 'F', '\0', '\1', '\2', tag.empty() ? 'x' : tag[0]};
  return e;
}

// A compile callback that counts its calls.
struct Compiler {
  std::atomic<int> calls{0};
  CacheEntry entry = sampleEntry();
  std::function<CacheEntry()> fn() {
    return [this] {
      ++calls;
      return entry;
    };
  }
};

const std::string kKey = KernelCache::make_key("source", "13.0", {"-arch=sm_90a"}, "sm_90a", "0.1.0");

std::string readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void writeFile(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

TEST(KernelCache, KeyIs32HexDigitsAndDeterministic) {
  EXPECT_TRUE(std::regex_match(kKey, std::regex("[0-9a-f]{32}"))) << kKey;
  EXPECT_EQ(kKey, KernelCache::make_key("source", "13.0", {"-arch=sm_90a"}, "sm_90a", "0.1.0"));
}

TEST(KernelCache, KeyChangesWhenAnyFieldChanges) {
  std::set<std::string> keys = {
      kKey,
      KernelCache::make_key("source ", "13.0", {"-arch=sm_90a"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.1", {"-arch=sm_90a"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=sm_90"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=sm_90a", "-lineinfo"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=sm_90a"}, "sm_90", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=sm_90a"}, "sm_90a", "0.1.1"),
      // Length prefixes: moving a boundary between fields changes the key.
      KernelCache::make_key("sourc", "e13.0", {"-arch=sm_90a"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=", "sm_90a"}, "sm_90a", "0.1.0"),
      KernelCache::make_key("source", "13.0", {"-arch=sm_90asm_90a"}, "", "0.1.0"),
  };
  EXPECT_EQ(keys.size(), 11u);
}

TEST(KernelCache, MissThenMemoryHitThenDiskHit) {
  TempDir dir;
  Compiler compiler;
  {
    KernelCache cache(dir.path());
    EXPECT_TRUE(cache.persistent());
    KernelCache::Result first = cache.get_or_compile(kKey, compiler.fn());
    EXPECT_EQ(first.hit, CacheHit::Miss);
    EXPECT_EQ(first.entry->ptx, compiler.entry.ptx);
    EXPECT_EQ(first.entry->cubin, compiler.entry.cubin);
    EXPECT_TRUE(fs::exists(cache.entry_path(kKey)));

    KernelCache::Result second = cache.get_or_compile(kKey, compiler.fn());
    EXPECT_EQ(second.hit, CacheHit::Memory);
    EXPECT_EQ(second.entry, first.entry);
    const CacheStats s = cache.stats();
    EXPECT_EQ(s.misses, 1u);
    EXPECT_EQ(s.memory_hits, 1u);
    EXPECT_EQ(s.disk_hits, 0u);
  }
  KernelCache reopened(dir.path());
  KernelCache::Result third = reopened.get_or_compile(kKey, compiler.fn());
  EXPECT_EQ(third.hit, CacheHit::Disk);
  EXPECT_EQ(third.entry->ptx, compiler.entry.ptx);
  EXPECT_EQ(third.entry->cubin, compiler.entry.cubin);
  EXPECT_EQ(reopened.stats().disk_hits, 1u);
  EXPECT_EQ(reopened.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Memory);
  EXPECT_EQ(compiler.calls, 1);

  reopened.drop_memory();
  EXPECT_EQ(reopened.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Disk);
  EXPECT_EQ(compiler.calls, 1);
}

TEST(KernelCache, PtxOnlyAndEmptyEntriesRoundTrip) {
  TempDir dir;
  for (const CacheEntry& entry : {CacheEntry{"ptx only", {}}, CacheEntry{}}) {
    const std::string key = KernelCache::make_key(entry.ptx, "13.0", {}, "sm_80", "0.1.0");
    KernelCache(dir.path()).get_or_compile(key, [&] { return entry; });
    KernelCache reopened(dir.path());
    KernelCache::Result r = reopened.get_or_compile(key, [] () -> CacheEntry { throw std::runtime_error("recompiled"); });
    EXPECT_EQ(r.hit, CacheHit::Disk);
    EXPECT_EQ(r.entry->ptx, entry.ptx);
    EXPECT_TRUE(r.entry->cubin.empty());
  }
}

TEST(KernelCache, EmptyDirIsMemoryOnly) {
  KernelCache cache{fs::path()};
  EXPECT_FALSE(cache.persistent());
  Compiler compiler;
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Miss);
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Memory);
  EXPECT_EQ(compiler.calls, 1);
}

// Each damages a published entry in its own way.
struct Damage {
  const char* name;
  std::string (*apply)(const std::string& good);
};

const Damage kDamages[] = {
    {"flipped payload byte",
     [](const std::string& good) {
       std::string bad = good;
       bad[bad.size() - 3] ^= 0x20;
       return bad;
     }},
    {"truncated payload", [](const std::string& good) { return good.substr(0, good.size() - 5); }},
    {"truncated header", [](const std::string& good) { return good.substr(0, 20); }},
    {"empty file", [](const std::string&) { return std::string(); }},
    {"garbage header",
     [](const std::string& good) {
       std::string bad = good;
       for (size_t i = 0; i < 48; ++i) bad[i] = static_cast<char>(i * 37 + 11);
       return bad;
     }},
    {"wrong format version",
     [](const std::string& good) {
       std::string bad = good;
       bad[8] = 99;
       return bad;
     }},
    {"extra trailing bytes", [](const std::string& good) { return good + "junk"; }},
    {"sizes claim more than the file",
     [](const std::string& good) {
       std::string bad = good;
       bad[16] = static_cast<char>(bad[16] + 1);  // one more PTX byte than there is
       return bad;
     }},
};

TEST(KernelCache, CorruptEntriesAreRecompiledAndRepublished) {
  for (const Damage& damage : kDamages) {
    SCOPED_TRACE(damage.name);
    TempDir dir;
    Compiler compiler;
    KernelCache(dir.path()).get_or_compile(kKey, compiler.fn());
    const fs::path file = KernelCache(dir.path()).entry_path(kKey);
    const std::string good = readFile(file);
    ASSERT_GT(good.size(), 48u);
    writeFile(file, damage.apply(good));

    KernelCache cache(dir.path());
    KernelCache::Result r = cache.get_or_compile(kKey, compiler.fn());
    EXPECT_EQ(r.hit, CacheHit::Miss);
    EXPECT_EQ(r.entry->ptx, compiler.entry.ptx);
    EXPECT_EQ(r.entry->cubin, compiler.entry.cubin);
    EXPECT_EQ(compiler.calls, 2);
    EXPECT_EQ(cache.stats().corrupt_entries, 1u);
    EXPECT_EQ(readFile(file), good) << "the recompiled entry was not republished";
    EXPECT_EQ(KernelCache(dir.path()).get_or_compile(kKey, compiler.fn()).hit, CacheHit::Disk);
  }
}

TEST(KernelCache, EntryRenamedToAnotherKeyIsNotLoaded) {
  TempDir dir;
  Compiler compiler;
  KernelCache cache(dir.path());
  cache.get_or_compile(kKey, compiler.fn());
  const std::string other = KernelCache::make_key("other", "13.0", {}, "sm_90a", "0.1.0");
  fs::copy_file(cache.entry_path(kKey), cache.entry_path(other));
  KernelCache reopened(dir.path());
  EXPECT_EQ(reopened.get_or_compile(other, compiler.fn()).hit, CacheHit::Miss);
  EXPECT_EQ(reopened.stats().corrupt_entries, 1u);
}

TEST(KernelCache, UnwritableDirFallsBackToMemory) {
  TempDir dir;
  // A directory cannot be created under a regular file, whatever the user's privileges.
  writeFile(dir.path() / "file", "x");
  const fs::path unusable = dir.path() / "file" / "cache";
  testing::internal::CaptureStderr();
  KernelCache cache(unusable);
  Compiler compiler;
  KernelCache::Result first = cache.get_or_compile(kKey, compiler.fn());
  KernelCache::Result second = cache.get_or_compile(kKey, compiler.fn());
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.persistent());
  EXPECT_EQ(first.hit, CacheHit::Miss);
  EXPECT_EQ(second.hit, CacheHit::Memory);
  EXPECT_EQ(compiler.calls, 1);
  EXPECT_NE(warnings.find(unusable.string()), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("memory only"), std::string::npos) << warnings;
}

TEST(KernelCache, DirRemovedAfterOpeningFallsBackToMemoryWithOneWarning) {
  std::optional<TempDir> dir(std::in_place);
  const fs::path path = dir->path() / "cache";
  KernelCache cache(path);
  ASSERT_TRUE(cache.persistent());
  dir.reset();
  testing::internal::CaptureStderr();
  Compiler compiler;
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Miss);
  EXPECT_EQ(cache.get_or_compile(KernelCache::make_key("2", "", {}, "", ""), compiler.fn()).hit, CacheHit::Miss);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.persistent());
  EXPECT_EQ(compiler.calls, 2);
  size_t count = 0;
  for (size_t at = warnings.find("twell: warning"); at != std::string::npos; at = warnings.find("twell: warning", at + 1))
    ++count;
  EXPECT_EQ(count, 1u) << warnings;
}

// Runs get_or_compile on another thread; if it has not returned after 20 s (blocked in open() on a FIFO
// at `fifo`), fails and opens the FIFO's write end so that the blocked reader returns and the test ends.
KernelCache::Result getOrCompileWithoutHanging(KernelCache& cache, const std::string& key, Compiler& compiler,
                                               const fs::path& fifo) {
  std::future<KernelCache::Result> result =
      std::async(std::launch::async, [&] { return cache.get_or_compile(key, compiler.fn()); });
  if (result.wait_for(std::chrono::seconds(20)) == std::future_status::timeout) {
    ADD_FAILURE() << "get_or_compile blocked for 20 s on the FIFO at " << fifo;
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  return result.get();
}

TEST(KernelCache, FifoAtTheEntryPathIsReplacedWithoutBlocking) {
  TempDir dir;
  Compiler compiler;
  KernelCache(dir.path()).get_or_compile(kKey, compiler.fn());
  const fs::path file = KernelCache(dir.path()).entry_path(kKey);
  const std::string good = readFile(file);
  ASSERT_TRUE(fs::remove(file));
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0) << std::strerror(errno);

  KernelCache cache(dir.path());
  KernelCache::Result r = getOrCompileWithoutHanging(cache, kKey, compiler, file);
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_EQ(r.entry->ptx, compiler.entry.ptx);
  EXPECT_EQ(compiler.calls, 2);
  EXPECT_EQ(cache.stats().corrupt_entries, 1u);
  EXPECT_TRUE(cache.persistent());
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(file))) << "the FIFO was not replaced";
  EXPECT_EQ(readFile(file), good);
  EXPECT_EQ(KernelCache(dir.path()).get_or_compile(kKey, compiler.fn()).hit, CacheHit::Disk);
}

TEST(KernelCache, LinkToAFifoAtTheEntryPathIsReplacedWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir.path() / "elsewhere";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  KernelCache cache(dir.path());
  fs::create_symlink(fifo, cache.entry_path(kKey));
  Compiler compiler;
  KernelCache::Result r = getOrCompileWithoutHanging(cache, kKey, compiler, fifo);
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_EQ(cache.stats().corrupt_entries, 1u);
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(cache.entry_path(kKey))));
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo))) << "the link's target was touched";
  EXPECT_EQ(KernelCache(dir.path()).get_or_compile(kKey, compiler.fn()).hit, CacheHit::Disk);
}

TEST(KernelCache, FifoAtTheLockPathIsReplacedWithoutBlocking) {
  TempDir dir;
  KernelCache cache(dir.path());
  const fs::path lock = dir.path() / (kKey + ".lock");
  ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0) << std::strerror(errno);
  Compiler compiler;
  KernelCache::Result r = getOrCompileWithoutHanging(cache, kKey, compiler, lock);
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(lock)));
  EXPECT_EQ(KernelCache(dir.path()).get_or_compile(kKey, compiler.fn()).hit, CacheHit::Disk);
  EXPECT_EQ(compiler.calls, 1);
}

// A failure on one key's files (here: lock paths that are directories, which are left alone) keeps
// that key in memory only, with one warning, and leaves the disk cache on for every other key.
TEST(KernelCache, FailureOnOneKeyLeavesTheOtherKeysOnDisk) {
  TempDir dir;
  Compiler compiler;
  const std::string published = KernelCache::make_key("published", "13.0", {}, "sm_90a", "0.1.0");
  const std::string blocked2 = KernelCache::make_key("blocked 2", "13.0", {}, "sm_90a", "0.1.0");
  const std::string later = KernelCache::make_key("later", "13.0", {}, "sm_90a", "0.1.0");
  KernelCache(dir.path()).get_or_compile(published, compiler.fn());
  for (const std::string& key : {kKey, blocked2}) {
    fs::create_directories(dir.path() / (key + ".lock") / "inside");
  }

  testing::internal::CaptureStderr();
  KernelCache cache(dir.path());
  KernelCache::Result blocked = cache.get_or_compile(kKey, compiler.fn());
  KernelCache::Result disk = cache.get_or_compile(published, compiler.fn());
  KernelCache::Result blockedAgain = cache.get_or_compile(blocked2, compiler.fn());
  KernelCache::Result fresh = cache.get_or_compile(later, compiler.fn());
  const std::string warnings = testing::internal::GetCapturedStderr();

  EXPECT_EQ(blocked.hit, CacheHit::Miss);
  EXPECT_EQ(blocked.entry->ptx, compiler.entry.ptx);
  EXPECT_EQ(disk.hit, CacheHit::Disk) << "one key's failure turned the disk cache off";
  EXPECT_EQ(blockedAgain.hit, CacheHit::Miss);
  EXPECT_EQ(fresh.hit, CacheHit::Miss);
  EXPECT_TRUE(cache.persistent());
  EXPECT_TRUE(cache.writable());
  EXPECT_FALSE(fs::exists(cache.entry_path(kKey))) << "published without holding the key's lock";
  EXPECT_TRUE(fs::exists(cache.entry_path(later))) << "a key after the failure was not published";
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Memory);
  EXPECT_NE(warnings.find(kKey + ".lock"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("memory only"), std::string::npos) << warnings;
  size_t count = 0;
  for (size_t at = warnings.find("twell: warning"); at != std::string::npos; at = warnings.find("twell: warning", at + 1))
    ++count;
  EXPECT_EQ(count, 1u) << warnings;
  EXPECT_TRUE(fs::is_directory(dir.path() / (kKey + ".lock") / "inside")) << "someone's directory was removed";
}

// A directory at an entry path is not an entry and is not removed: the key is cached in memory only.
TEST(KernelCache, DirectoryAtTheEntryPathIsLeftAlone) {
  TempDir dir;
  KernelCache cache(dir.path());
  fs::create_directories(cache.entry_path(kKey) / "inside");
  testing::internal::CaptureStderr();
  Compiler compiler;
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Miss);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cache.stats().corrupt_entries, 1u);
  EXPECT_TRUE(fs::is_directory(cache.entry_path(kKey) / "inside"));
  EXPECT_TRUE(cache.persistent());
  EXPECT_NE(warnings.find(cache.entry_path(kKey).string()), std::string::npos) << warnings;
  const std::string other = KernelCache::make_key("other", "13.0", {}, "sm_90a", "0.1.0");
  EXPECT_EQ(cache.get_or_compile(other, compiler.fn()).hit, CacheHit::Miss);
  EXPECT_EQ(KernelCache(dir.path()).get_or_compile(other, compiler.fn()).hit, CacheHit::Disk);
}

// The checks on a read-only directory holding a valid entry for kKey and a damaged one for `damaged`.
// Returns what failed (empty: all passed); runs in this process or in a child without privileges.
std::string readOnlyDirChecks(const fs::path& dir, const std::string& damaged) {
  std::string failures;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) failures += what + "\n";
  };
  std::set<std::string> before;
  for (const auto& e : fs::directory_iterator(dir)) before.insert(e.path().filename().string());

  testing::internal::CaptureStderr();
  KernelCache cache(dir);
  Compiler compiler;
  KernelCache::Result valid =
      cache.get_or_compile(kKey, []() -> CacheEntry { throw std::runtime_error("recompiled a valid entry"); });
  KernelCache::Result bad = cache.get_or_compile(damaged, compiler.fn());
  const std::string fresh = KernelCache::make_key("not on disk", "13.0", {}, "sm_90a", "0.1.0");
  KernelCache::Result missing = cache.get_or_compile(fresh, compiler.fn());
  KernelCache::Result again = cache.get_or_compile(fresh, compiler.fn());
  const std::string warnings = testing::internal::GetCapturedStderr();

  check(cache.persistent(), "persistent() is false: the read-only directory is not used");
  check(!cache.writable(), "writable() is true for a read-only directory");
  check(valid.hit == CacheHit::Disk, "the valid entry was not loaded from the read-only directory");
  check(valid.entry->ptx == sampleEntry().ptx, "the loaded entry differs");
  check(bad.hit == CacheHit::Miss && missing.hit == CacheHit::Miss, "damaged or missing entries were not compiled");
  check(again.hit == CacheHit::Memory, "a compiled kernel was not kept in memory");
  check(compiler.calls == 2, "compile ran " + std::to_string(compiler.calls.load()) + " times, expected 2");
  check(cache.stats().corrupt_entries == 1, "the damaged entry was not counted");
  check(warnings.find(dir.string()) != std::string::npos && warnings.find("memory only") != std::string::npos,
        "no warning naming the directory: " + warnings);
  std::set<std::string> after;
  for (const auto& e : fs::directory_iterator(dir)) after.insert(e.path().filename().string());
  check(after == before, "the read-only directory changed");
  return failures;
}

TEST(KernelCache, ReadOnlyDirServesItsEntries) {
  TempDir dir;
  const std::string damaged = KernelCache::make_key("damaged", "13.0", {}, "sm_90a", "0.1.0");
  {
    KernelCache cache(dir.path());
    Compiler compiler;
    cache.get_or_compile(kKey, compiler.fn());
    cache.get_or_compile(damaged, compiler.fn());
    writeFile(cache.entry_path(damaged), "not an entry");
  }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0) << std::strerror(errno);
  struct RestoreMode {
    const fs::path& dir;
    ~RestoreMode() { ::chmod(dir.c_str(), 0700); }
  } restore{dir.path()};

  if (::access(dir.path().c_str(), W_OK) != 0) {
    EXPECT_EQ(readOnlyDirChecks(dir.path(), damaged), "");
    return;
  }
  // Root writes anywhere: run the checks in a child that gives up its privileges (to nobody).
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    std::string result;
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)
      result = "SKIP: cannot drop privileges: " + std::string(std::strerror(errno));
    else if (::access(dir.path().c_str(), W_OK) == 0)
      result = "SKIP: the directory is still writable after dropping privileges";
    else
      result = readOnlyDirChecks(dir.path(), damaged);
    if (::write(out[1], result.data(), result.size()) < 0) _exit(2);
    _exit(0);
  }
  ::close(out[1]);
  std::string result;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof(buffer))) > 0;) result.append(buffer, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  if (result.rfind("SKIP: ", 0) == 0)
    GTEST_SKIP() << "running as root, chmod 0555 does not make " << dir.path()
                 << " read-only, and the check as user nobody is impossible: " << result.substr(6);
  EXPECT_EQ(result, "");
}

TEST(KernelCache, RejectsKeysThatAreNotFileNames) {
  KernelCache cache{fs::path()};
  Compiler compiler;
  for (const std::string& key : {std::string(), std::string("../escape"), std::string("a/b"), std::string(".hidden"),
                                 std::string(129, 'a')}) {
    try {
      cache.get_or_compile(key, compiler.fn());
      ADD_FAILURE() << "accepted key \"" << key << "\"";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("key"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(compiler.calls, 0);
}

TEST(KernelCache, FailedCompileCachesNothing) {
  TempDir dir;
  KernelCache cache(dir.path());
  EXPECT_THROW(cache.get_or_compile(kKey, []() -> CacheEntry { throw Error(ErrorCode::Compile, "boom"); }), Error);
  EXPECT_FALSE(fs::exists(cache.entry_path(kKey)));
  Compiler compiler;
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Miss);
  EXPECT_EQ(compiler.calls, 1);
  EXPECT_EQ(cache.stats().misses, 2u);
}

TEST(KernelCache, LeavesNoTemporaryFiles) {
  TempDir dir;
  KernelCache cache(dir.path());
  Compiler compiler;
  cache.get_or_compile(kKey, compiler.fn());
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{kKey + ".twk", kKey + ".lock"}));
}

TEST(KernelCache, TwoThreadsAskingOneKeyCompileOnce) {
  TempDir dir;
  KernelCache cache(dir.path());
  std::atomic<int> calls{0};
  auto slow = [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return sampleEntry();
  };
  KernelCache::Result results[2];
  std::thread a([&] { results[0] = cache.get_or_compile(kKey, slow); });
  std::thread b([&] { results[1] = cache.get_or_compile(kKey, slow); });
  a.join();
  b.join();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(results[0].entry, results[1].entry);
  std::multiset<CacheHit> hits = {results[0].hit, results[1].hit};
  EXPECT_EQ(hits, (std::multiset<CacheHit>{CacheHit::Memory, CacheHit::Miss}));
}

TEST(KernelCache, DifferentKeysCompileConcurrently) {
  KernelCache cache{fs::path()};
  std::atomic<int> inside{0}, most{0};
  auto slow = [&] {
    most = std::max(most.load(), ++inside);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    --inside;
    return sampleEntry();
  };
  std::thread a([&] { cache.get_or_compile("key1", slow); });
  std::thread b([&] { cache.get_or_compile("key2", slow); });
  a.join();
  b.join();
  EXPECT_EQ(most, 2);
}

// Two processes on one directory: the second waits on the per-key lock and loads the first's entry.
TEST(KernelCache, TwoProcessesAskingOneKeyCompileOnce) {
  TempDir dir;
  const fs::path started = dir.path() / "child-started";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    KernelCache cache(dir.path());
    KernelCache::Result r = cache.get_or_compile(kKey, [&] {
      writeFile(started, "1");
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return sampleEntry("child");
    });
    _exit(r.hit == CacheHit::Miss ? 0 : 1);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(started) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(started)) << "the child never started compiling";
  KernelCache cache(dir.path());
  Compiler compiler;
  KernelCache::Result r = cache.get_or_compile(kKey, compiler.fn());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(compiler.calls, 0);
  EXPECT_EQ(r.hit, CacheHit::Disk);
  EXPECT_EQ(r.entry->ptx, sampleEntry("child").ptx);
}

class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvVar() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(KernelCache, DefaultDirFollowsTheEnvironment) {
  EnvVar home("HOME", "/home/someone");
  {
    EnvVar twell("TWELL_CACHE_DIR", "/tmp/twell-explicit");
    EnvVar xdg("XDG_CACHE_HOME", "/tmp/xdg");
    EXPECT_EQ(KernelCache::default_dir(), fs::path("/tmp/twell-explicit"));
  }
  {
    EnvVar twell("TWELL_CACHE_DIR", "");
    EnvVar xdg("XDG_CACHE_HOME", "/tmp/xdg");
    EXPECT_EQ(KernelCache::default_dir(), fs::path("/tmp/xdg/twell"));
  }
  {
    EnvVar twell("TWELL_CACHE_DIR", nullptr);
    EnvVar xdg("XDG_CACHE_HOME", "relative/ignored");
    EXPECT_EQ(KernelCache::default_dir(), fs::path("/home/someone/.cache/twell"));
  }
}

// ---- Size cap, stale files, bounded lock waits, tools (issue 16, item 3) ----

// An entry of `ptx_bytes` PTX bytes and 8 cubin bytes: its file has 48 + ptx_bytes + 8 bytes.
CacheEntry sizedEntry(char fill, size_t ptx_bytes) {
  CacheEntry e;
  e.ptx.assign(ptx_bytes, fill);
  e.cubin = {'\x7f', 'E', 'L', 'F', fill, fill, fill, fill};
  return e;
}
constexpr size_t kSizedPtx = 4000, kSizedFile = 48 + kSizedPtx + 8;

// Sets the path's mtime to `seconds_ago` seconds before now.
void setAge(const fs::path& p, int seconds_ago) {
  timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << p << ": " << std::strerror(errno);
}

uint64_t entryBytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".twk") total += fs::file_size(e.path());
  return total;
}

std::set<std::string> names(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// An exclusive flock on a path through its own open file description (so it conflicts with the cache's
// locks in this process too), like another process holding the key's lock.
class HeldLock {
 public:
  explicit HeldLock(const fs::path& p) : fd_(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    EXPECT_GE(fd_, 0) << p << ": " << std::strerror(errno);
    EXPECT_EQ(::flock(fd_, LOCK_EX | LOCK_NB), 0) << p << ": " << std::strerror(errno);
  }
  ~HeldLock() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

CacheLimits limitsOf(uint64_t max_bytes, std::chrono::milliseconds lock_timeout = std::chrono::seconds(30)) {
  CacheLimits limits;
  limits.max_bytes = max_bytes;
  limits.lock_timeout = lock_timeout;
  return limits;
}

TEST(KernelCacheLimits, EvictsLeastRecentlyUsedEntriesToKeepTheCap) {
  TempDir dir;
  const CacheLimits limits = limitsOf(3 * kSizedFile + kSizedFile / 2);
  {
    KernelCache cache(dir.path(), limits);
    for (const char* key : {"k1", "k2", "k3"}) cache.get_or_compile(key, [&] { return sizedEntry(key[1], kSizedPtx); });
  }
  ASSERT_EQ(fs::file_size(dir.path() / "k1.twk"), kSizedFile);
  setAge(dir.path() / "k1.twk", 300);
  setAge(dir.path() / "k2.twk", 200);
  setAge(dir.path() / "k3.twk", 100);

  KernelCache cache(dir.path(), limits);
  // A disk hit makes k1 the most recently used: k2 is now the oldest.
  EXPECT_EQ(cache.get_or_compile("k1", [] () -> CacheEntry { throw std::runtime_error("recompiled"); }).hit,
            CacheHit::Disk);
  EXPECT_EQ(cache.get_or_compile("k4", [] { return sizedEntry('4', kSizedPtx); }).hit, CacheHit::Miss);
  EXPECT_EQ(names(dir.path()), (std::set<std::string>{"k1.twk", "k1.lock", "k3.twk", "k3.lock", "k4.twk", "k4.lock"}))
      << "expected k2 (least recently used) evicted with its lock file";
  EXPECT_EQ(cache.stats().evicted_entries, 1u);
  for (const char* key : {"k5", "k6", "k7"}) {
    cache.get_or_compile(key, [&] { return sizedEntry(key[1], kSizedPtx); });
    EXPECT_LE(entryBytes(dir.path()), limits.max_bytes) << "after " << key;
    EXPECT_TRUE(fs::exists(dir.path() / (std::string(key) + ".twk"))) << "the entry just published was evicted";
  }
  EXPECT_EQ(entryBytes(dir.path()), 3 * kSizedFile);
  EXPECT_EQ(cache.stats().evicted_entries, 4u);
}

TEST(KernelCacheLimits, EvictionSkipsAnEntryWhoseLockIsHeld) {
  TempDir dir;
  const CacheLimits limits = limitsOf(2 * kSizedFile + kSizedFile / 2);
  KernelCache cache(dir.path(), limits);
  cache.get_or_compile("k1", [] { return sizedEntry('1', kSizedPtx); });
  cache.get_or_compile("k2", [] { return sizedEntry('2', kSizedPtx); });
  setAge(dir.path() / "k1.twk", 300);
  setAge(dir.path() / "k2.twk", 200);
  HeldLock held(dir.path() / "k1.lock");  // another process loading k1 under its lock
  cache.get_or_compile("k3", [] { return sizedEntry('3', kSizedPtx); });
  EXPECT_EQ(names(dir.path()), (std::set<std::string>{"k1.twk", "k1.lock", "k3.twk", "k3.lock"}))
      << "expected the held k1 skipped and k2 evicted";
}

TEST(KernelCacheLimits, TheEntryJustPublishedIsKeptEvenAboveTheCap) {
  TempDir dir;
  KernelCache cache(dir.path(), limitsOf(kSizedFile / 2));
  cache.get_or_compile("k1", [] { return sizedEntry('1', kSizedPtx); });
  EXPECT_TRUE(fs::exists(dir.path() / "k1.twk"));
  cache.get_or_compile("k2", [] { return sizedEntry('2', kSizedPtx); });
  EXPECT_EQ(names(dir.path()), (std::set<std::string>{"k2.twk", "k2.lock"}));
}

TEST(KernelCacheLimits, StaleTemporariesAreRemovedWhenTheCacheOpens) {
  TempDir dir;
  const fs::path stale = dir.path() / ".k1.4242.4243.0.tmp", fresh = dir.path() / ".k2.4242.4243.1.tmp",
                 writing = dir.path() / ".k3.4242.4243.2.tmp", probe = dir.path() / ".probe.4242.4242.3.tmp";
  for (const fs::path& p : {stale, fresh, writing, probe}) writeFile(p, "partial entry");
  for (const fs::path& p : {stale, writing, probe}) setAge(p, 20 * 60);
  HeldLock held(dir.path() / "k3.lock");  // a writer stopped for 20 minutes before its rename
  KernelCache cache(dir.path());
  EXPECT_EQ(names(dir.path()), (std::set<std::string>{fresh.filename().string(), writing.filename().string(), "k3.lock"}));
  EXPECT_EQ(cache.stats().removed_temporaries, 2u);
}

TEST(KernelCacheLimits, StaleLockFilesWithoutEntriesAreRemovedAfterAPublish) {
  TempDir dir;
  for (const char* name : {"old.lock", "new.lock", "held.lock"}) writeFile(dir.path() / name, "");
  setAge(dir.path() / "old.lock", 20 * 60);
  setAge(dir.path() / "held.lock", 20 * 60);
  HeldLock held(dir.path() / "held.lock");
  KernelCache cache(dir.path());
  cache.get_or_compile(kKey, [] { return sampleEntry(); });
  EXPECT_EQ(names(dir.path()), (std::set<std::string>{"new.lock", "held.lock", kKey + ".twk", kKey + ".lock"}));
}

TEST(KernelCacheLimits, LockWaitIsBoundedThenCompilesInMemory) {
  TempDir dir;
  KernelCache cache(dir.path(), limitsOf(CacheLimits::kDefaultMaxBytes, std::chrono::milliseconds(1300)));
  const fs::path lock = dir.path() / (kKey + ".lock");
  HeldLock held(lock);  // a holder that is stopped (SIGSTOP): alive, never releasing
  Compiler compiler;
  testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  KernelCache::Result r = cache.get_or_compile(kKey, compiler.fn());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string messages = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_EQ(r.entry->ptx, compiler.entry.ptx);
  EXPECT_GE(waited, 1.25);
  EXPECT_LT(waited, 10.0);
  EXPECT_NE(messages.find("waiting for the lock " + lock.string()), std::string::npos) << messages;
  EXPECT_NE(messages.find("still held after 1.3 s"), std::string::npos) << messages;
  EXPECT_NE(messages.find("in memory without publishing"), std::string::npos) << messages;
  EXPECT_FALSE(fs::exists(cache.entry_path(kKey))) << "published without holding the key's lock";
  EXPECT_EQ(cache.stats().lock_timeouts, 1u);
  EXPECT_EQ(cache.get_or_compile(kKey, compiler.fn()).hit, CacheHit::Memory);
  EXPECT_EQ(compiler.calls, 1);
}

TEST(KernelCacheLimits, LockWaitEndsWhenTheHolderReleases) {
  TempDir dir;
  KernelCache cache(dir.path());
  HeldLock held(dir.path() / (kKey + ".lock"));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    held.release();
  });
  Compiler compiler;
  testing::internal::CaptureStderr();
  KernelCache::Result r = cache.get_or_compile(kKey, compiler.fn());
  const std::string messages = testing::internal::GetCapturedStderr();
  releaser.join();
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_TRUE(fs::exists(cache.entry_path(kKey)));
  EXPECT_EQ(messages, "");
  EXPECT_EQ(cache.stats().lock_timeouts, 0u);
}

// A locker that waited on a lock file its holder then removed must not use it: a third process may
// already hold the new file at that path.
TEST(KernelCacheLimits, ALockerRechecksTheLockFileAfterItsHolderRemovedIt) {
  TempDir dir;
  KernelCache cache(dir.path());
  const fs::path lock = dir.path() / (kKey + ".lock");
  auto remover = std::make_unique<HeldLock>(lock);
  std::atomic<bool> compiled{false};
  std::thread waiter([&] {
    cache.get_or_compile(kKey, [&] {
      compiled = true;
      return sampleEntry();
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the waiter has opened the old file
  ASSERT_EQ(::unlink(lock.c_str()), 0);
  auto newcomer = std::make_unique<HeldLock>(lock);  // locks the new file at the path
  remover.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(compiled) << "compiled while another held the lock file at the path";
  newcomer.reset();
  waiter.join();
  EXPECT_TRUE(compiled);
  EXPECT_TRUE(fs::exists(cache.entry_path(kKey)));
}

TEST(KernelCacheTools, ScanClassifiesTheFiles) {
  TempDir dir;
  KernelCache(dir.path()).get_or_compile(kKey, [] { return sampleEntry(); });
  writeFile(dir.path() / ".k2.1.2.3.tmp", "x");
  writeFile(dir.path() / "README", "not the cache's");
  std::vector<KernelCache::File> files = KernelCache::scan(dir.path());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].kind, KernelCache::File::Kind::Temporary);
  EXPECT_EQ(files[0].key, "k2");
  EXPECT_EQ(files[1].kind, KernelCache::File::Kind::Lock);
  EXPECT_EQ(files[2].kind, KernelCache::File::Kind::Entry);
  EXPECT_EQ(files[2].key, kKey);
  EXPECT_EQ(files[2].bytes, fs::file_size(KernelCache(dir.path()).entry_path(kKey)));
  EXPECT_TRUE(files[2].regular);
  try {
    KernelCache::scan(dir.path() / "missing");
    ADD_FAILURE() << "scanned a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NotFound);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(KernelCacheTools, ValidateFileSaysWhatIsWrong) {
  TempDir dir;
  KernelCache cache(dir.path());
  cache.get_or_compile(kKey, [] { return sampleEntry(); });
  const fs::path file = cache.entry_path(kKey);
  CacheEntry loaded;
  EXPECT_EQ(KernelCache::validate_file(file, kKey, &loaded), "");
  EXPECT_EQ(loaded.ptx, sampleEntry().ptx);
  EXPECT_NE(KernelCache::validate_file(file, "otherkey").find("another key"), std::string::npos);
  const std::string good = readFile(file);
  for (const Damage& damage : kDamages) {
    writeFile(file, damage.apply(good));
    EXPECT_NE(KernelCache::validate_file(file, kKey), "") << damage.name;
  }
  writeFile(file, good.substr(0, good.size() - 5));
  EXPECT_NE(KernelCache::validate_file(file, kKey).find("truncated"), std::string::npos);
  ASSERT_TRUE(fs::remove(file));
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  EXPECT_NE(KernelCache::validate_file(file, kKey).find("FIFO"), std::string::npos);
}

TEST(KernelCacheTools, CorruptEntryIsReportedInTheResult) {
  TempDir dir;
  Compiler compiler;
  KernelCache(dir.path()).get_or_compile(kKey, compiler.fn());
  const fs::path file = KernelCache(dir.path()).entry_path(kKey);
  writeFile(file, "garbage");
  KernelCache cache(dir.path());
  KernelCache::Result r = cache.get_or_compile(kKey, compiler.fn());
  EXPECT_EQ(r.hit, CacheHit::Miss);
  EXPECT_TRUE(r.corrupt);
  EXPECT_FALSE(cache.get_or_compile("fresh", compiler.fn()).corrupt);
  EXPECT_FALSE(KernelCache(dir.path()).get_or_compile(kKey, compiler.fn()).corrupt);
}

TEST(KernelCacheTools, RemoveKeyAndClearHoldEachLock) {
  TempDir dir;
  {
    KernelCache cache(dir.path());
    for (const char* key : {"k1", "k2", "k3"}) cache.get_or_compile(key, [] { return sampleEntry(); });
  }
  writeFile(dir.path() / ".k1.1.1.1.tmp", "left by a killed writer");
  writeFile(dir.path() / "k3.twk", "damaged");
  EXPECT_EQ(KernelCache::remove_key(dir.path(), "k1", true), KernelCache::Removal::Kept);
  EXPECT_EQ(KernelCache::remove_key(dir.path(), "k3", true), KernelCache::Removal::Removed);
  EXPECT_FALSE(fs::exists(dir.path() / "k3.twk"));
  EXPECT_FALSE(fs::exists(dir.path() / "k3.lock"));
  {
    HeldLock held(dir.path() / "k2.lock");
    EXPECT_EQ(KernelCache::remove_key(dir.path(), "k2"), KernelCache::Removal::InUse);
    const KernelCache::Cleared cleared = KernelCache::clear(dir.path());
    EXPECT_EQ(cleared.entries, 1u);
    EXPECT_EQ(cleared.temporaries, 1u);
    EXPECT_EQ(cleared.locks, 1u);
    EXPECT_EQ(cleared.keys_in_use, 1u);
    EXPECT_EQ(names(dir.path()), (std::set<std::string>{"k2.twk", "k2.lock"}));
  }
  const KernelCache::Cleared cleared = KernelCache::clear(dir.path());
  EXPECT_EQ(cleared.entries, 1u);
  EXPECT_EQ(cleared.keys_in_use, 0u);
  EXPECT_EQ(names(dir.path()), std::set<std::string>{});
  EXPECT_THROW(KernelCache::remove_key(dir.path(), "../x"), Error);
}

TEST(KernelCacheLimits, FromTheEnvironment) {
  {
    EnvVar bytes("TWELL_CACHE_MAX_BYTES", nullptr);
    EnvVar timeout("TWELL_CACHE_LOCK_TIMEOUT_S", nullptr);
    EXPECT_EQ(CacheLimits::from_env().max_bytes, uint64_t{2} << 30);
    EXPECT_EQ(CacheLimits::from_env().lock_timeout, std::chrono::seconds(30));
  }
  {
    EnvVar bytes("TWELL_CACHE_MAX_BYTES", "0");
    EnvVar timeout("TWELL_CACHE_LOCK_TIMEOUT_S", "2.5");
    EXPECT_EQ(CacheLimits::from_env().max_bytes, CacheLimits::kDefaultMaxBytes);
    EXPECT_EQ(CacheLimits::from_env().lock_timeout, std::chrono::milliseconds(2500));
  }
  for (const auto& [text, bytes] : std::vector<std::pair<const char*, uint64_t>>{
           {"123456", 123456}, {"64K", 64 << 10}, {"512M", uint64_t{512} << 20}, {"3G", uint64_t{3} << 30}}) {
    EnvVar var("TWELL_CACHE_MAX_BYTES", text);
    EXPECT_EQ(CacheLimits::from_env().max_bytes, bytes) << text;
  }
  // Invalid values: the default, and one warning per variable for the whole process.
  EnvVar bytes("TWELL_CACHE_MAX_BYTES", "lots");
  EnvVar timeout("TWELL_CACHE_LOCK_TIMEOUT_S", "-1");
  testing::internal::CaptureStderr();
  const CacheLimits first = CacheLimits::from_env();
  const CacheLimits second = CacheLimits::from_env();
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.max_bytes, CacheLimits::kDefaultMaxBytes);
  EXPECT_EQ(second.lock_timeout, CacheLimits::kDefaultLockTimeout);
  EXPECT_NE(warnings.find("$TWELL_CACHE_MAX_BYTES: expected a number of bytes"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("got 'lots'"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("$TWELL_CACHE_LOCK_TIMEOUT_S"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("got '-1'"), std::string::npos) << warnings;
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 2) << warnings;
  for (const char* bad : {"12X", "1e3", " 5", "99999999999999999999", "17179869184G"}) {
    EnvVar var("TWELL_CACHE_MAX_BYTES", bad);
    EXPECT_EQ(CacheLimits::from_env().max_bytes, CacheLimits::kDefaultMaxBytes) << bad;
  }
}

}  // namespace
