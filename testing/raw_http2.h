#ifndef HARRIER_TESTING_RAW_HTTP2_H_
#define HARRIER_TESTING_RAW_HTTP2_H_

// A bare HTTP/2 client of one harrier-server for tests of what a client
// that does not follow gRPC's rules can make the shard hold: streams whose
// message never ends, replies it never reads. It speaks just enough
// HTTP/2: the preface, SETTINGS (acknowledged), PING (answered), flow
// control for what it sends (WINDOW_UPDATE), and it notes which streams
// the server ended (END_STREAM or RST_STREAM). It never grants the server
// window beyond the initial 64 KiB, so a reply larger than that stays on
// the server. Request headers are HPACK literals without indexing.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace harrier::testing {

class RawHttp2Connection {
 public:
  // Connects to 127.0.0.1:`port` and exchanges the preface; null on failure.
  static std::unique_ptr<RawHttp2Connection> Connect(int port, absl::Duration timeout);
  ~RawHttp2Connection();

  // Opens stream `id` (odd, increasing) as a gRPC call of `path`
  // ("/package.Service/Method") with `metadata`; false if the socket failed.
  bool OpenStream(uint32_t id, const std::string& path,
                  const std::vector<std::pair<std::string, std::string>>& metadata);
  // Sends `bytes` on stream `id` as DATA frames as the server's windows
  // allow, until all went, the stream ended or `deadline`. Returns the
  // bytes sent.
  size_t SendData(uint32_t id, const std::string& bytes, bool end_stream, absl::Time deadline);
  // Whether the server ended stream `id`, waiting until `deadline`.
  bool WaitEnded(uint32_t id, absl::Time deadline);

  // The 5-byte gRPC message prefix announcing `length` bytes.
  static std::string MessagePrefix(uint32_t length);

 private:
  explicit RawHttp2Connection(int fd) : fd_(fd) {}
  bool WriteFrame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload);
  void ReadLoop();

  const int fd_;
  absl::Mutex write_mutex_;
  mutable absl::Mutex mutex_;
  int64_t connection_window_ ABSL_GUARDED_BY(mutex_) = 65535;
  int64_t initial_stream_window_ ABSL_GUARDED_BY(mutex_) = 65535;
  std::map<uint32_t, int64_t> stream_windows_ ABSL_GUARDED_BY(mutex_);
  std::map<uint32_t, bool> ended_ ABSL_GUARDED_BY(mutex_);
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;  // the socket failed or GOAWAY
  std::thread reader_;
};

// The resident set of process `pid` in bytes (VmRSS), or -1.
int64_t ResidentBytes(int pid);

}  // namespace harrier::testing

#endif  // HARRIER_TESTING_RAW_HTTP2_H_
