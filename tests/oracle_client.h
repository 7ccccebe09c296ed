#pragma once

// The client side of tests/oracle_server.py.
//
// Note [Python oracle server]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Oracle scripts compare lamp with PyTorch; each run of one used to start a
// Python that imported torch (and often torchvision) first: 4-6 s of CPU,
// a few hundred times a test run. CTest's `python_oracle` fixture starts one
// server that has imported them, and sets LAMP_ORACLE_SOCKET (a Unix socket)
// for every test. A request is one connection:
//   client -> server: a 4-byte big-endian length, then the NUL-separated
//     fields cwd, script path, argument string (split as a POSIX shell would
//     split it; no expansions), and the client's environment, one entry a
//     field. The first bytes carry two fds (SCM_RIGHTS): the write end of a
//     pipe that becomes the script's stdout, and the client's stderr.
//   The server forks; the child runs the script as `__main__` and closes its
//   stdout; the client reads the pipe to its end, then the 4-byte exit
//   status from the socket. A child that dies without one (a crash) reads as
//   a failure.
// The server is single-threaded and forks before anything starts a thread,
// so each request runs in a process that is a fresh interpreter but for the
// imports already done. With no server (no variable, nothing listening) the
// test starts Python itself, as before: the results are the same either way.

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

extern char** environ;

namespace lamp::test {

/// The script's exit status and its standard output.
struct OracleRun {
  int status = 0;
  std::string out;
};

namespace oracle_detail {

inline void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      throw std::runtime_error(
          std::string("oracle server: send: ") + std::strerror(errno));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads to the end of fd, or until `limit` bytes.
inline std::string read_all(int fd, size_t limit = SIZE_MAX) {
  std::string out;
  std::array<char, 65536> buffer{};
  while (out.size() < limit) {
    const ssize_t n =
        read(fd, buffer.data(), std::min(buffer.size(), limit - out.size()));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    out.append(buffer.data(), static_cast<size_t>(n));
  }
  return out;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    reset();
  }
  void reset() {
    if (fd >= 0) {
      close(fd);
    }
    fd = -1;
  }
};

} // namespace oracle_detail

/// Runs `script args` on the server named by LAMP_ORACLE_SOCKET; nullopt
/// when there is no server to ask (then start Python yourself).
/// See Note [Python oracle server].
inline std::optional<OracleRun> run_on_oracle_server(
    const std::string& script,
    const std::string& args) {
  using namespace oracle_detail;
  const char* path = std::getenv("LAMP_ORACLE_SOCKET");
  sockaddr_un address{};
  if (path == nullptr || std::strlen(path) >= sizeof(address.sun_path)) {
    return std::nullopt;
  }
  Fd sock{socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, path);
  if (sock.fd < 0 ||
      connect(sock.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) !=
          0) {
    return std::nullopt;
  }
  std::array<int, 2> out_pipe{};
  if (pipe2(out_pipe.data(), O_CLOEXEC) != 0) {
    throw std::runtime_error("oracle server: pipe failed");
  }
  Fd read_end{out_pipe[0]}, write_end{out_pipe[1]};

  std::array<char, PATH_MAX> cwd{};
  if (getcwd(cwd.data(), cwd.size()) == nullptr) {
    throw std::runtime_error("oracle server: getcwd failed");
  }
  std::string fields = std::string(cwd.data()) + '\0' + script + '\0' + args;
  for (char** e = environ; *e != nullptr; ++e) {
    fields += '\0';
    fields += *e;
  }
  const auto size = static_cast<uint32_t>(fields.size());
  const std::array<char, 4> header{
      static_cast<char>(size >> 24),
      static_cast<char>(size >> 16),
      static_cast<char>(size >> 8),
      static_cast<char>(size)};

  // The header goes with the two fds, then the fields.
  const std::array<int, 2> fds{write_end.fd, STDERR_FILENO};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof fds)> control{};
  iovec io{const_cast<char*>(header.data()), header.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof fds);
  ssize_t sent = 0;
  do {
    sent = sendmsg(sock.fd, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(header.size())) {
    // NOTE: a server that went away (idle, stopped) between connect and
    // send: start Python instead.
    return std::nullopt;
  }
  send_all(sock.fd, fields.data(), fields.size());
  // Only the script may hold the pipe's write end now, so its end is EOF.
  write_end.reset();

  OracleRun run;
  run.out = read_all(read_end.fd);
  const std::string status = read_all(sock.fd, 4);
  if (status.size() != 4) {
    run.status = -1; // the script's process died without a status
  } else {
    const auto* b = reinterpret_cast<const unsigned char*>(status.data());
    run.status = static_cast<int32_t>(
        (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
        (uint32_t{b[2]} << 8) | uint32_t{b[3]});
  }
  return run;
}

} // namespace lamp::test
