// A bounded, non-blocking read of a regular file, shared by the readers of files that others may have
// replaced (the tuning file format here, the runtime's kernel cache): the file is opened without
// blocking and without following a final symbolic link, and is read only if it is a regular file of at
// most a given size. The caller opens (and closes) the descriptor, so it can keep using it (the kernel
// cache sets a valid entry's mtime through it); what each reader says about a refused file is its own.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace twell::detail {

// open(2) of `path` for reading with O_NONBLOCK (a FIFO does not block), O_NOFOLLOW (a final symbolic
// link fails with ELOOP) and O_CLOEXEC: a descriptor, or -1 with errno set.
int open_for_bounded_read(const std::filesystem::path& path);

// What read_bounded found.
struct BoundedRead {
  enum class Status {
    Read,        // `bytes` holds the file
    CannotStat,  // fstat failed: `error`
    NotRegular,  // a directory, FIFO, socket or device: `mode`
    TooLarge,    // more than the limit: `size`
  };
  Status status = Status::CannotStat;
  int error = 0;      // CannotStat: fstat's errno
  mode_t mode = 0;    // fstat's st_mode (all but CannotStat)
  int64_t size = 0;   // fstat's st_size (all but CannotStat)
  std::string bytes;  // Read: the content, fewer than `size` bytes if the file shrank while read
};

// fstat of `fd`, then, if it is a regular file of at most `max_bytes`, its content (read to the end,
// retried on EINTR; a read error ends it early). Never throws but for std::bad_alloc.
BoundedRead read_bounded(int fd, int64_t max_bytes);

}  // namespace twell::detail
