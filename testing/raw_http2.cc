#include "testing/raw_http2.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

namespace harrier::testing {
namespace {

constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoAway = 7,
                  kWindowUpdate = 8;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
constexpr size_t kMaxFrame = 16384;

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t wrote = ::send(fd, data, n, MSG_NOSIGNAL);
    if (wrote <= 0) return false;
    data += wrote;
    n -= static_cast<size_t>(wrote);
  }
  return true;
}

bool ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got <= 0) return false;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t Be32(const char* p) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(p[0])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(p[1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(p[2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(p[3]));
}

// An HPACK string literal (no Huffman) with its 7-bit-prefix length.
void AppendString(std::string* out, const std::string& s) {
  size_t n = s.size();
  if (n < 127) {
    out->push_back(static_cast<char>(n));
  } else {
    out->push_back(static_cast<char>(127));
    n -= 127;
    while (n >= 128) {
      out->push_back(static_cast<char>((n % 128) + 128));
      n /= 128;
    }
    out->push_back(static_cast<char>(n));
  }
  out->append(s);
}

}  // namespace

std::unique_ptr<RawHttp2Connection> RawHttp2Connection::Connect(int port, absl::Duration timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return nullptr;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return nullptr;
  }
  std::unique_ptr<RawHttp2Connection> connection(new RawHttp2Connection(fd));
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  if (!WriteAll(fd, kPreface, sizeof(kPreface) - 1) ||
      !connection->WriteFrame(kSettings, 0, 0, "")) {
    return nullptr;
  }
  connection->reader_ = std::thread([raw = connection.get()] { raw->ReadLoop(); });
  return connection;
}

RawHttp2Connection::~RawHttp2Connection() {
  ::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  ::close(fd_);
}

bool RawHttp2Connection::WriteFrame(uint8_t type, uint8_t flags, uint32_t stream,
                                    const std::string& payload) {
  char header[9];
  const uint32_t length = static_cast<uint32_t>(payload.size());
  header[0] = static_cast<char>(length >> 16);
  header[1] = static_cast<char>(length >> 8);
  header[2] = static_cast<char>(length);
  header[3] = static_cast<char>(type);
  header[4] = static_cast<char>(flags);
  header[5] = static_cast<char>((stream >> 24) & 0x7f);
  header[6] = static_cast<char>(stream >> 16);
  header[7] = static_cast<char>(stream >> 8);
  header[8] = static_cast<char>(stream);
  absl::MutexLock lock(&write_mutex_);
  return WriteAll(fd_, header, sizeof(header)) && WriteAll(fd_, payload.data(), payload.size());
}

void RawHttp2Connection::ReadLoop() {
  char header[9];
  std::string payload;
  while (ReadAll(fd_, header, sizeof(header))) {
    const uint32_t length = (static_cast<uint32_t>(static_cast<uint8_t>(header[0])) << 16) |
                            (static_cast<uint32_t>(static_cast<uint8_t>(header[1])) << 8) |
                            static_cast<uint32_t>(static_cast<uint8_t>(header[2]));
    const uint8_t type = static_cast<uint8_t>(header[3]);
    const uint8_t flags = static_cast<uint8_t>(header[4]);
    const uint32_t stream = Be32(header + 5) & 0x7fffffff;
    payload.resize(length);
    if (length > 0 && !ReadAll(fd_, payload.data(), length)) break;
    if (type == kSettings && !(flags & kAck)) {
      {
        absl::MutexLock lock(&mutex_);
        for (size_t i = 0; i + 6 <= payload.size(); i += 6) {
          const uint16_t id = static_cast<uint16_t>((static_cast<uint8_t>(payload[i]) << 8) |
                                                    static_cast<uint8_t>(payload[i + 1]));
          if (id != 0x4) continue;  // SETTINGS_INITIAL_WINDOW_SIZE
          const int64_t value = Be32(payload.data() + i + 2);
          for (auto& [id_, window] : stream_windows_) window += value - initial_stream_window_;
          initial_stream_window_ = value;
        }
      }
      WriteFrame(kSettings, kAck, 0, "");
    } else if (type == kPing && !(flags & kAck)) {
      WriteFrame(kPing, kAck, 0, payload);
    } else if (type == kWindowUpdate && payload.size() == 4) {
      absl::MutexLock lock(&mutex_);
      const int64_t increment = Be32(payload.data()) & 0x7fffffff;
      if (stream == 0) {
        connection_window_ += increment;
      } else {
        stream_windows_[stream] += increment;
      }
    } else if ((type == kHeaders || type == kData) && (flags & kEndStream)) {
      absl::MutexLock lock(&mutex_);
      ended_[stream] = true;
    } else if (type == kRstStream) {
      absl::MutexLock lock(&mutex_);
      ended_[stream] = true;
    } else if (type == kGoAway) {
      absl::MutexLock lock(&mutex_);
      closed_ = true;
    }
  }
  absl::MutexLock lock(&mutex_);
  closed_ = true;
}

bool RawHttp2Connection::OpenStream(
    uint32_t id, const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string block;
  auto literal = [&block](const std::string& name, const std::string& value) {
    block.push_back(0x00);  // literal without indexing, new name
    AppendString(&block, name);
    AppendString(&block, value);
  };
  literal(":method", "POST");
  literal(":scheme", "http");
  literal(":path", path);
  literal(":authority", "127.0.0.1");
  literal("content-type", "application/grpc");
  literal("te", "trailers");
  for (const auto& [name, value] : metadata) literal(name, value);
  {
    absl::MutexLock lock(&mutex_);
    stream_windows_.emplace(id, initial_stream_window_);
  }
  return WriteFrame(kHeaders, kEndHeaders, id, block);
}

size_t RawHttp2Connection::SendData(uint32_t id, const std::string& bytes, bool end_stream,
                                    absl::Time deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    size_t n = 0;
    {
      absl::MutexLock lock(&mutex_);
      auto can_send = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return closed_ || ended_[id] || (connection_window_ > 0 && stream_windows_[id] > 0);
      };
      if (!mutex_.AwaitWithDeadline(absl::Condition(&can_send), deadline)) {
        return sent;
      }
      if (closed_ || ended_[id]) return sent;
      n = std::min<size_t>({bytes.size() - sent, kMaxFrame,
                            static_cast<size_t>(std::max<int64_t>(0, connection_window_)),
                            static_cast<size_t>(std::max<int64_t>(0, stream_windows_[id]))});
      connection_window_ -= static_cast<int64_t>(n);
      stream_windows_[id] -= static_cast<int64_t>(n);
    }
    const bool last = sent + n == bytes.size();
    if (!WriteFrame(kData, end_stream && last ? kEndStream : 0, id, bytes.substr(sent, n))) {
      return sent;
    }
    sent += n;
  }
  return sent;
}

bool RawHttp2Connection::WaitEnded(uint32_t id, absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  auto ended = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return ended_[id]; };
  return mutex_.AwaitWithDeadline(absl::Condition(&ended), deadline);
}

std::string RawHttp2Connection::MessagePrefix(uint32_t length) {
  std::string prefix(5, '\0');
  prefix[1] = static_cast<char>(length >> 24);
  prefix[2] = static_cast<char>(length >> 16);
  prefix[3] = static_cast<char>(length >> 8);
  prefix[4] = static_cast<char>(length);
  return prefix;
}

int64_t ResidentBytes(int pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

}  // namespace harrier::testing
