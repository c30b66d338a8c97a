// `twellc cache list|stats|clear|verify`: the JIT's kernel cache directory (runtime/src/cache.h) seen and
// cleaned from the command line. Everything goes through KernelCache's public functions (scan,
// validate_file, remove_key, clear), so the format and the locking rules live in one place.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cache.h"
#include "commands.h"
#include "twell/error.h"

namespace twellc {

namespace {

using twell::detail::CacheEntry;
using twell::detail::CacheLimits;
using twell::detail::KernelCache;
using File = KernelCache::File;

const char* kCacheHelp =
    "usage: twellc cache list   [--dir D]          every entry: key, bytes, last use, contents, kernel name\n"
    "       twellc cache stats  [--dir D]          entries and their bytes against the cap, temporaries, lock files\n"
    "       twellc cache clear  [--dir D] [--force] removes entries, temporaries and lock files (keys another process\n"
    "                                              holds are left in place; refuses a directory that is no twell\n"
    "                                              cache unless --force)\n"
    "       twellc cache verify [--dir D] [--fix]  validates every entry as the loader does and names each damaged one;\n"
    "                                              exit status 1 if any is left damaged (--fix removes them)\n"
    "  --dir D   the cache directory (default: $TWELL_CACHE_DIR, else $XDG_CACHE_HOME/twell, else ~/.cache/twell)\n"
    "  The cap on the entries' bytes is $TWELL_CACHE_MAX_BYTES (default 2G); least recently used entries are\n"
    "  evicted after each publish. $TWELL_CACHE_LOCK_TIMEOUT_S (default 30) bounds the wait for another process's\n"
    "  lock on a kernel.\n";

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 3) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, units[unit]);
}

std::string age(std::chrono::system_clock::time_point when) {
  const long long s = std::max<long long>(
      0, std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - when).count());
  if (s < 120) return fmt::format("{} s ago", s);
  if (s < 120 * 60) return fmt::format("{} min ago", s / 60);
  if (s < 48 * 3600) return fmt::format("{} h ago", s / 3600);
  return fmt::format("{} d ago", s / 86400);
}

// The first kernel the PTX defines (".entry NAME"), or "".
std::string kernel_name(const std::string& ptx) {
  const size_t at = ptx.find(".entry ");
  if (at == std::string::npos) return {};
  size_t i = at + 7;
  while (i < ptx.size() && (ptx[i] == ' ' || ptx[i] == '\t')) ++i;
  size_t end = i;
  while (end < ptx.size() && (std::isalnum(static_cast<unsigned char>(ptx[end])) || ptx[end] == '_' || ptx[end] == '$'))
    ++end;
  return ptx.substr(i, end - i);
}

int list(const std::filesystem::path& dir, const std::vector<File>& files) {
  std::vector<const File*> entries;
  uint64_t bytes = 0;
  for (const File& f : files)
    if (f.kind == File::Kind::Entry) {
      entries.push_back(&f);
      bytes += f.bytes;
    }
  std::printf("kernel cache %s: %zu entries, %s\n", dir.c_str(), entries.size(), human_bytes(bytes).c_str());
  if (entries.empty()) return 0;
  std::printf("%-32s  %10s  %-11s  %-9s  %s\n", "key", "bytes", "last used", "contents", "kernel");
  for (const File* f : entries) {
    CacheEntry entry;
    const std::string problem = KernelCache::validate_file(f->path, f->key, &entry);
    const std::string contents = !problem.empty() ? "damaged" : entry.cubin.empty() ? "ptx" : "ptx+cubin";
    const std::string detail = problem.empty() ? kernel_name(entry.ptx) : "(" + problem + ")";
    std::printf("%-32s  %10llu  %-11s  %-9s  %s\n", f->key.c_str(), static_cast<unsigned long long>(f->bytes),
                age(f->modified).c_str(), contents.c_str(), detail.c_str());
  }
  return 0;
}

int stats(const std::filesystem::path& dir, const std::vector<File>& files) {
  uint64_t entries = 0, entry_bytes = 0, temporaries = 0, temporary_bytes = 0, stale = 0, locks = 0;
  const auto now = std::chrono::system_clock::now();
  for (const File& f : files) {
    switch (f.kind) {
      case File::Kind::Entry:
        ++entries;
        entry_bytes += f.bytes;
        break;
      case File::Kind::Temporary:
        ++temporaries;
        temporary_bytes += f.bytes;
        stale += now - f.modified >= KernelCache::kStaleAge;
        break;
      case File::Kind::Lock:
        ++locks;
        break;
    }
  }
  const CacheLimits limits = CacheLimits::from_env();
  std::printf("kernel cache %s\n", dir.c_str());
  std::printf("  entries      %llu, %s (%llu bytes) of the %s cap ($TWELL_CACHE_MAX_BYTES)\n",
              static_cast<unsigned long long>(entries), human_bytes(entry_bytes).c_str(),
              static_cast<unsigned long long>(entry_bytes), human_bytes(limits.max_bytes).c_str());
  std::printf("  temporaries  %llu, %s (%llu older than %lld min, removed at the next open or publish)\n",
              static_cast<unsigned long long>(temporaries), human_bytes(temporary_bytes).c_str(),
              static_cast<unsigned long long>(stale), static_cast<long long>(KernelCache::kStaleAge.count()));
  std::printf("  lock files   %llu\n", static_cast<unsigned long long>(locks));
  std::printf("  lock wait    at most %.1f s ($TWELL_CACHE_LOCK_TIMEOUT_S)\n",
              static_cast<double>(limits.lock_timeout.count()) / 1000);
  return 0;
}

// Whether `dir` holds a twell kernel cache: at least one entry that begins with the entry magic (or
// nothing of a cache at all: then nothing is removed either way). `clear` refuses other directories (a
// mistyped --dir must not delete another program's *.twk or *.lock files) unless --force.
bool looks_like_a_cache(const std::vector<File>& files) {
  for (const File& f : files) {
    if (f.kind != File::Kind::Entry || !f.regular) continue;
    char magic[8] = {};
    std::ifstream in(f.path, std::ios::binary);
    if (in.read(magic, sizeof magic) && std::string_view(magic, sizeof magic) == "TWELLK01") return true;
  }
  return files.empty();  // an empty directory: nothing to remove either way
}

int clear(const std::filesystem::path& dir, bool force) {
  if (!force && !looks_like_a_cache(KernelCache::scan(dir))) {
    std::fprintf(stderr, "twellc cache clear: %s does not look like a twell kernel cache (no entry begins with TWELLK01, or "
                         "nothing of a cache is there): nothing removed; pass --force to clear its *.twk, *.lock and "
                         "*.tmp files anyway\n", dir.c_str());
    return 1;
  }
  const KernelCache::Cleared c = KernelCache::clear(dir);
  std::printf("removed %llu entries (%s), %llu temporaries and %llu lock files from %s\n",
              static_cast<unsigned long long>(c.entries), human_bytes(c.entry_bytes).c_str(),
              static_cast<unsigned long long>(c.temporaries), static_cast<unsigned long long>(c.locks), dir.c_str());
  if (c.keys_in_use > 0)
    std::printf("left %llu keys in place: another process holds their locks (compiling or loading them)\n",
                static_cast<unsigned long long>(c.keys_in_use));
  return 0;
}

int verify(const std::filesystem::path& dir, const std::vector<File>& files, bool fix) {
  uint64_t checked = 0, damaged = 0, removed = 0, left = 0;
  for (const File& f : files) {
    if (f.kind != File::Kind::Entry) continue;
    ++checked;
    const std::string problem = KernelCache::validate_file(f.path, f.key);
    if (problem.empty()) continue;
    ++damaged;
    std::string outcome;
    if (!fix) {
      ++left;
    } else {
      switch (KernelCache::remove_key(dir, f.key, true)) {
        case KernelCache::Removal::Removed:
          ++removed;
          outcome = ": removed";
          break;
        case KernelCache::Removal::Kept:
          outcome = ": valid now (republished meanwhile), kept";
          break;
        case KernelCache::Removal::InUse:
          ++left;
          outcome = ": not removed, another process holds its lock (it replaces a damaged entry itself)";
          break;
        case KernelCache::Removal::NotRemovable:
          ++left;
          outcome = ": not removed, it is a directory";
          break;
      }
    }
    std::printf("damaged %s: %s%s\n", f.path.c_str(), problem.c_str(), outcome.c_str());
  }
  std::printf("verified %llu entries in %s: %llu damaged", static_cast<unsigned long long>(checked), dir.c_str(),
              static_cast<unsigned long long>(damaged));
  if (fix) std::printf(", %llu removed", static_cast<unsigned long long>(removed));
  std::printf("\n");
  if (left > 0 && !fix) std::printf("`twellc cache verify --fix` removes them (the loader also replaces each on use)\n");
  return left > 0 ? 1 : 0;
}

int run(const std::string& sub, const std::vector<std::string>& args) {
  const Args a = parse_args(args, {"fix", "force", "help"}, {"dir"});
  if (a.has("help")) {
    std::fputs(kCacheHelp, stdout);
    return 0;
  }
  if (!a.positional.empty())
    throw std::invalid_argument(fmt::format("unexpected argument '{}' (options are --dir D{})", a.positional.front(),
                                            sub == "verify" ? " and --fix" : ""));
  if (a.has("fix") && sub != "verify") throw std::invalid_argument(fmt::format("--fix: only `cache verify` takes it"));
  if (a.has("force") && sub != "clear") throw std::invalid_argument(fmt::format("--force: only `cache clear` takes it"));
  if (a.has("dir") && a.get("dir").empty())
    throw std::invalid_argument("--dir: expected a directory, got ''");
  const std::filesystem::path dir = a.has("dir") ? std::filesystem::path(a.get("dir")) : KernelCache::default_dir();
  if (dir.empty())
    throw twell::Error(twell::ErrorCode::NotFound,
                       "no cache directory: $TWELL_CACHE_DIR, $XDG_CACHE_HOME and $HOME are unset (give --dir D)");
  if (sub == "clear") {
    if (!a.has("dir") && !std::filesystem::exists(dir)) {
      std::printf("no kernel cache at %s yet (the directory does not exist): nothing to clear\n", dir.c_str());
      return 0;
    }
    return clear(dir, a.has("force"));
  }
  std::vector<File> files;
  try {
    files = KernelCache::scan(dir);
  } catch (const twell::Error& e) {
    // The default directory appears with the first cached kernel: its absence is no error.
    if (e.code() != twell::ErrorCode::NotFound || a.has("dir")) throw;
    std::printf("no kernel cache at %s yet (the directory does not exist): 0 entries\n", dir.c_str());
    return 0;
  }
  if (sub == "list") return list(dir, files);
  if (sub == "stats") return stats(dir, files);
  return verify(dir, files, a.has("fix"));
}

}  // namespace

int cache_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kCacheHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  if (sub != "list" && sub != "stats" && sub != "clear" && sub != "verify") {
    std::fprintf(stderr, "twellc cache: expected list, stats, clear or verify, got '%s'\n%s", sub.c_str(), kCacheHelp);
    return 2;
  }
  int rc = 1;
  try {
    rc = run(sub, std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc cache %s: %s\n%s", sub.c_str(), e.what(), kCacheHelp);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twellc cache %s: error: %s\n", sub.c_str(), e.what());
    return 1;
  }
  return rc;  // main checks that standard output was written
}

}  // namespace twellc
