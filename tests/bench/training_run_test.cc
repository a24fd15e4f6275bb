// The readers of rank 0's output that tta and convergence share: eval
// lines with and without the loss key, lines cut short, and
// --metrics_out traffic.
#include "bench/training_run.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

namespace harrier::bench {
namespace {

TEST_CASE("ParseEvalLines reads step, accuracy, wall time and loss") {
  const std::string log =
      "[worker 0] rank 0 of 4\n"
      "eval step=20 accuracy=0.7530 wall_s=1.016\n"
      "step 100 loss 0.5\n"
      "eval step=40 accuracy=0.8012 wall_s=2.044 loss=0.6123\n"
      "eval step=60 accuracy=0.81";  // still being written
  const std::vector<EvalPoint> points = ParseEvalLines(log);
  REQUIRE(points.size() == 2);
  CHECK(points[0].step == 20);
  CHECK(points[0].accuracy == Approx(0.7530));
  CHECK(points[0].wall_s == Approx(1.016));
  CHECK(points[0].loss == -1);  // a worker that prints no loss=
  CHECK(points[1].step == 40);
  CHECK(points[1].accuracy == Approx(0.8012));
  CHECK(points[1].wall_s == Approx(2.044));
  CHECK(points[1].loss == Approx(0.6123));
}

TEST_CASE("ParseEvalLines skips a line with a bad number") {
  const std::vector<EvalPoint> points =
      ParseEvalLines("eval step=x accuracy=0.5 wall_s=1\neval step=5 accuracy=0.5 wall_s=1\n");
  REQUIRE(points.size() == 1);
  CHECK(points[0].step == 5);
}

TEST_CASE("ReadTraffic reads every complete metrics line") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/metrics.jsonl";
  {
    std::ofstream out(path);
    out << "{\"rank\":0,\"step\":1,\"loss\":2.3,\"bytes_pushed\":100,\"bytes_pulled\":200}\n"
        << "{\"rank\":0,\"step\":2,\"loss\":2.1,\"bytes_pushed\":250,\"bytes_pulled\":400}\n"
        << "{\"rank\":0,\"step\":3,\"bytes_pus";
  }
  const std::vector<TrafficPoint> traffic = ReadTraffic(path);
  REQUIRE(traffic.size() == 2);
  CHECK(traffic[1].step == 2);
  CHECK(traffic[1].bytes_pushed == 250);
  CHECK(traffic[1].bytes_pulled == 400);
  CHECK(ReadTraffic(path + ".missing").empty());
}

TEST_CASE("JsonNumber") {
  CHECK(JsonNumber("{\"a\":1.5,\"b\":-2}", "b").value() == -2);
  CHECK(!JsonNumber("{\"a\":1.5}", "b").has_value());
}

}  // namespace
}  // namespace harrier::bench
