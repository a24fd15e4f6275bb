// ps-lite's side of bench/scripts/pslite_compare.sh: one server holding one
// key per message size and applying SGD (w -= 0.01 g) to each push, one
// worker timing ZPush and ZPull of 4 KiB, 1 MiB and 16 MiB, one JSON line
// per point ({"bench":"pslite","op":...,"bytes":...,"gbps":...,"p50_us":...}).
// Built against a ps-lite checkout by that script; not part of the Bazel
// build (nothing is downloaded at build time).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"
using namespace ps;  // NOLINT: ps-lite's own examples do so
static std::unordered_map<Key, SArray<float>> store;
void Handler(const KVMeta& meta, const KVPairs<float>& data, KVServer<float>* server) {
  KVPairs<float> res;
  if (meta.push) {
    size_t off = 0;
    for (size_t i = 0; i < data.keys.size(); ++i) {
      const int len = data.lens.empty() ? data.vals.size() : data.lens[i];
      auto& w = store[data.keys[i]];
      if (w.size() != (size_t)len) w = SArray<float>(len, 0.f);
      const float* g = data.vals.data() + off;
      float* wp = w.data();
      for (int j = 0; j < len; ++j) wp[j] -= 0.01f * g[j];
      off += len;
    }
    server->Response(meta, res);
  } else {
    // One key per call here: the reply shares the stored array, no copy.
    res.keys = data.keys;
    const SArray<float>& w = store[data.keys[0]];
    res.vals = w;
    res.lens = SArray<int>(1, static_cast<int>(w.size()));
    server->Response(meta, res);
  }
}
int main(int argc, char** argv) {
  Start(0);
  if (IsServer()) {
    auto server = new KVServer<float>(0);
    server->set_request_handle(Handler);
    RegisterExitCallback([server]() { delete server; });
  }
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    for (size_t bytes : {size_t(4) << 10, size_t(1) << 20, size_t(16) << 20}) {
      const int n = bytes / 4;
      SArray<Key> keys(1, Key(bytes));
      SArray<float> vals(n, 1.0f);
      SArray<int> lens(1, n);
      kv.Wait(kv.ZPush(keys, vals, lens));
      const int iters = bytes <= 4096 ? 3000 : std::max<int>(20, (int)((size_t(2) << 30) / bytes));
      for (int op = 0; op < 2; ++op) {
        std::vector<double> lat;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          auto a = std::chrono::steady_clock::now();
          if (op == 0) {
            kv.Wait(kv.ZPush(keys, vals, lens));
          } else {
            SArray<float> out;
            SArray<int> outlens;
            kv.Wait(kv.ZPull(keys, &out, &outlens));
          }
          lat.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::sort(lat.begin(), lat.end());
        std::printf(
            "{\"bench\":\"pslite\",\"op\":\"%s\",\"bytes\":%zu,\"gbps\":%.3f,\"p50_us\":%.1f}\n",
            op == 0 ? "push" : "pull", bytes, bytes * (double)iters / s / 1e9,
            lat[lat.size() / 2] * 1e6);
        std::fflush(stdout);
      }
    }
  }
  Finalize(0, true);
  return 0;
}
