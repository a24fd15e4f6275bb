// Runs a libFuzzer-style target without libFuzzer: the target's seeds, then
// random mutations of them (bit flips, truncation, splices, random bytes),
// for a fixed number of inputs with a fixed seed, so a failure reproduces.
// A crash, an abort or a sanitizer report fails the test; any return value
// of the target is fine. Build the same target with clang -fsanitize=fuzzer
// for open-ended fuzzing (see tests/fuzz/README.md).
//
// `--write_seeds=DIR` writes the seeds as files DIR/seed-<i> instead, the
// start of a libFuzzer corpus (tests/fuzz/make_corpus.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
std::vector<std::string> FuzzSeeds();

namespace {

int WriteSeeds(const std::string& dir) {
  const std::vector<std::string> seeds = FuzzSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = dir + "/seed-" + std::to_string(i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("%zu seeds written to %s\n", seeds.size(), dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kWriteSeeds[] = "--write_seeds=";
  if (argc > 1 && std::strncmp(argv[1], kWriteSeeds, sizeof(kWriteSeeds) - 1) == 0) {
    return WriteSeeds(argv[1] + sizeof(kWriteSeeds) - 1);
  }
  int iterations = 20000;
  if (argc > 1) iterations = std::atoi(argv[1]);
  std::mt19937_64 rng(20261129);
  const std::vector<std::string> seeds = FuzzSeeds();
  auto run = [](const std::string& input) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  };
  for (const auto& seed : seeds) run(seed);
  for (int i = 0; i < iterations; ++i) {
    std::string input = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 5) {
        case 0:  // flip a bit
          if (!input.empty()) input[rng() % input.size()] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 1:  // truncate
          if (!input.empty()) input.resize(rng() % input.size());
          break;
        case 2:  // overwrite a 4-byte word with an extreme value
          if (input.size() >= 4) {
            const uint32_t values[] = {0u, 1u, 0x7fffffffu, 0xffffffffu, 0x7fc00000u /*NaN*/};
            const uint32_t value = values[rng() % 5];
            input.replace(rng() % (input.size() - 3), 4, reinterpret_cast<const char*>(&value), 4);
          }
          break;
        case 3:  // splice with another seed
          input += seeds[rng() % seeds.size()].substr(0, rng() % 64);
          break;
        default:  // random bytes
          input.push_back(static_cast<char>(rng()));
          break;
      }
    }
    run(input);
  }
  std::printf("%d fuzz inputs ran without a crash\n", iterations + static_cast<int>(seeds.size()));
  std::printf("1 checks passed, 0 failed\n");
  return 0;
}
