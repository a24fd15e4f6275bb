// HelloSecrets: the one-time secrets of the UCX and tcp hellos. Random
// bytes come from getrandom(2), or /dev/urandom on a kernel without it; a
// child process with getrandom filtered out (seccomp) shows the second.
#include "server/hello_secrets.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>
#include <string>

namespace harrier {
namespace {

bool IsHexSecret(const std::string& secret) {
  if (secret.size() != 64) return false;
  for (char c : secret) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

TEST_CASE("hello secrets are fresh 64-hex-digit strings, each taken once") {
  HelloSecrets secrets(/*required=*/true);
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string secret = secrets.Issue();
    CHECK(IsHexSecret(secret));
    seen.insert(secret);
  }
  CHECK(seen.size() == 100);
  const std::string secret = secrets.Issue();
  CHECK(secrets.Take(secret));
  CHECK_FALSE(secrets.Take(secret));
  CHECK_FALSE(secrets.Take(std::string(64, '0')));
  CHECK(HelloSecrets(/*required=*/false).Issue().empty());
}

// In a child: getrandom(2) answers ENOSYS, as on a kernel older than 3.17.
// Returns false when the filter could not be installed.
bool FilterOutGetrandom() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])),
                               filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) return false;
  char byte;
  return getrandom(&byte, 1, 0) < 0 && errno == ENOSYS;
}

TEST_CASE("without getrandom (ENOSYS) a secret comes from /dev/urandom, within a deadline") {
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(out[0]);
    std::string line = "no-filter\n";
    if (FilterOutGetrandom()) line = HelloSecrets(/*required=*/true).Issue() + "\n";
    const ssize_t written = write(out[1], line.data(), line.size());
    _exit(written == static_cast<ssize_t>(line.size()) ? 0 : 1);
  }
  close(out[1]);
  // A child that spins on the failing call never writes: 10 s, then it is
  // killed and the case fails.
  struct pollfd ready = {out[0], POLLIN, 0};
  const int polled = poll(&ready, 1, 10000);
  std::string said;
  if (polled == 1) {
    char buffer[128];
    ssize_t n;
    while ((n = read(out[0], buffer, sizeof(buffer))) > 0) said.append(buffer, n);
  }
  close(out[0]);
  if (polled != 1) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(polled == 1);
  if (said == "no-filter\n") {
    WARN("SKIPPED: seccomp filters are not allowed here");
    return;
  }
  INFO(said);
  REQUIRE(said.size() == 65);
  CHECK(IsHexSecret(said.substr(0, 64)));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace harrier
