#include "bounded_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace twell::detail {

int open_for_bounded_read(const std::filesystem::path& path) {
  return ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
}

BoundedRead read_bounded(int fd, int64_t max_bytes) {
  BoundedRead r;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    r.error = errno;
    return r;
  }
  r.mode = st.st_mode;
  r.size = static_cast<int64_t>(st.st_size);
  if (!S_ISREG(st.st_mode)) {
    r.status = BoundedRead::Status::NotRegular;
    return r;
  }
  if (r.size > max_bytes) {
    r.status = BoundedRead::Status::TooLarge;
    return r;
  }
  r.bytes.assign(static_cast<size_t>(r.size), '\0');
  size_t done = 0;
  while (done < r.bytes.size()) {
    const ssize_t n = ::read(fd, r.bytes.data() + done, r.bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  r.bytes.resize(done);
  r.status = BoundedRead::Status::Read;
  return r;
}

}  // namespace twell::detail
