// The C++ side of parity_test.py: the same pushes and pulls through
// worker/client.h that the test makes through the Python binding.
//   cpp_push_pull --servers=H:P,... --codec=SPEC --pull_codec=SPEC --n=N
//                 --steps=S --chunk_bytes=B --input=FILE --output=FILE
// FILE input: float32 initial values (n), then one gradient per step (n
// each); output: the pulled parameters after each step (n each).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/client.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "cpp_push_pull: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  harrier::ClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(10);
  size_t n = 0, steps = 0;
  std::string input, output;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    bool ok = true;
    if (absl::ConsumePrefix(&arg, "--servers=")) {
      options.servers = absl::StrSplit(arg, ',', absl::SkipEmpty());
    } else if (absl::ConsumePrefix(&arg, "--codec=")) {
      options.codec = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--pull_codec=")) {
      options.pull_codec = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--chunk_bytes=")) {
      ok = absl::SimpleAtoi(arg, &options.chunk_bytes);
    } else if (absl::ConsumePrefix(&arg, "--n=")) {
      ok = absl::SimpleAtoi(arg, &n);
    } else if (absl::ConsumePrefix(&arg, "--steps=")) {
      ok = absl::SimpleAtoi(arg, &steps);
    } else if (absl::ConsumePrefix(&arg, "--input=")) {
      input = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--output=")) {
      output = std::string(arg);
    } else {
      ok = false;
    }
    if (!ok) return Fail("bad argument " + std::string(argv[i]));
  }
  std::vector<float> data((steps + 1) * n);
  FILE* in = std::fopen(input.c_str(), "rb");
  if (in == nullptr || std::fread(data.data(), sizeof(float), data.size(), in) != data.size()) {
    return Fail("cannot read " + input);
  }
  std::fclose(in);
  auto client = harrier::Client::Create(options);
  if (!client.ok()) return Fail(client.status().ToString());
  const absl::Span<const float> all(data);
  if (auto s = (*client)->RegisterTensor("parity", {static_cast<int64_t>(n)}, all.subspan(0, n));
      !s.ok()) {
    return Fail(s.ToString());
  }
  std::vector<float> pulled(steps * n);
  for (size_t step = 0; step < steps; ++step) {
    if (auto s = (*client)->Push("parity", all.subspan((step + 1) * n, n)); !s.ok()) {
      return Fail(s.ToString());
    }
    (*client)->Clock();
    if (auto s = (*client)->Pull("parity", absl::MakeSpan(pulled).subspan(step * n, n)); !s.ok()) {
      return Fail(s.ToString());
    }
  }
  if (auto s = (*client)->Leave(); !s.ok()) return Fail(s.ToString());
  FILE* out = std::fopen(output.c_str(), "wb");
  if (out == nullptr ||
      std::fwrite(pulled.data(), sizeof(float), pulled.size(), out) != pulled.size() ||
      std::fclose(out) != 0) {
    return Fail("cannot write " + output);
  }
  return 0;
}
