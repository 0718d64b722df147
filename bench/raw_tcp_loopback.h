// The bound a benchmark of the wire measures against: the same bytes through plain
// sockets on 127.0.0.1.
#ifndef PARAMSERVER_BENCH_RAW_TCP_LOOPBACK_H_
#define PARAMSERVER_BENCH_RAW_TCP_LOOPBACK_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace paramserver {

// Raw TCP over loopback, the bound a transport is measured against: one listening
// socket; each "shard" connection sends its bytes and, with `echo`, reads as many back
// (as a push followed by a pull would). Exits the process when a socket fails.
class RawTcpLoopback {
 public:
  explicit RawTcpLoopback(std::vector<size_t> shard_bytes, bool echo = true)
      : shard_bytes_(std::move(shard_bytes)), echo_(echo) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener_, 64) != 0) {
      std::perror("raw tcp: bind/listen on 127.0.0.1");
      std::exit(1);
    }
    socklen_t length = sizeof(address);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    // Buffers are allocated and touched once: the bound is the wire, not the allocator.
    for (size_t bytes : shard_bytes_) {
      push_bytes_.emplace_back(bytes, 7);
      received_bytes_.emplace_back(bytes, 0);
      pulled_bytes_.emplace_back(bytes, 0);
    }
  }
  ~RawTcpLoopback() { close(listener_); }

  // Seconds for every shard's connection to send its bytes (and receive them back), all
  // shards in parallel (connections are made before the clock starts).
  double TimeOneRound() {
    const size_t n = shard_bytes_.size();
    std::vector<int> clients(n), accepted(n);
    for (size_t i = 0; i < n; ++i) {
      clients[i] = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      address.sin_port = htons(port_);
      if (connect(clients[i], reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
        std::perror("raw tcp: connect");
        std::exit(1);
      }
      accepted[i] = accept(listener_, nullptr, nullptr);
    }
    const absl::Time start = absl::Now();
    {
      std::vector<std::thread> threads;
      for (size_t i = 0; i < n; ++i) {
        // The server side: receive the push into its own buffer, send the pull back.
        threads.emplace_back([this, i, fd = accepted[i]] {
          ReadExactly(fd, received_bytes_[i].data(), shard_bytes_[i]);
          if (echo_) WriteAll(fd, received_bytes_[i].data(), shard_bytes_[i]);
        });
        // The worker side.
        threads.emplace_back([this, i, fd = clients[i]] {
          WriteAll(fd, push_bytes_[i].data(), shard_bytes_[i]);
          if (echo_) ReadExactly(fd, pulled_bytes_[i].data(), shard_bytes_[i]);
        });
      }
      for (std::thread& thread : threads) thread.join();
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    for (size_t i = 0; i < n; ++i) {
      close(clients[i]);
      close(accepted[i]);
    }
    return seconds;
  }

 private:
  // Sends (or receives) exactly `bytes` through `fd` with `move` (send or recv), in
  // pieces of at most 1 MiB; exits on failure.
  template <typename Data, typename Move>
  static void MoveAll(int fd, Data* data, size_t bytes, Move move, const char* what) {
    while (bytes > 0) {
      const ssize_t moved = move(fd, data, std::min<size_t>(bytes, 1 << 20), 0);
      if (moved <= 0) {
        std::perror(what);
        std::exit(1);
      }
      data += moved;
      bytes -= moved;
    }
  }
  static void WriteAll(int fd, const char* data, size_t bytes) {
    MoveAll(fd, data, bytes, send, "raw tcp: send");
  }
  static void ReadExactly(int fd, char* data, size_t bytes) {
    MoveAll(fd, data, bytes, recv, "raw tcp: recv");
  }

  const std::vector<size_t> shard_bytes_;
  const bool echo_;
  std::vector<std::vector<char>> push_bytes_, received_bytes_, pulled_bytes_;
  int listener_ = -1;
  int port_ = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_BENCH_RAW_TCP_LOOPBACK_H_
