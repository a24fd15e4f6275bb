// harrier-advise's cost model by hand-computed cases: each term of the
// step time under every sync mode, the shard side setting the pace when
// W > S, steps from a calibration (median, never reached, missing ->
// survey guess scaled from the grid's bsp/none), the ranking, and the
// calibration reader.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bench/advise/calibration.h"
#include "bench/advise/cost_model.h"
#include "common/codec/survey_codecs.h"

namespace harrier::advise {
namespace {

// 1 MB/s up, 2 MB/s down, 1 ms round trip: numbers easy to do by hand.
Link HandLink() {
  Link link;
  link.up_bytes_per_s = 1e6;
  link.down_bytes_per_s = 2e6;
  link.rtt_s = 0.001;
  return link;
}

CodecCost HandCodec() {
  CodecCost c;
  c.push_bytes = 1000;     // 1 ms up at 1 MB/s
  c.pull_bytes = 4000;     // 2 ms down at 2 MB/s
  c.encode_push_s = 0.0005;
  c.decode_push_s = 0.0001;
  c.encode_pull_s = 0.0002;
  c.decode_pull_s = 0.0003;
  return c;
}

TEST_CASE("PredictStep: bsp adds compute, codec and comm; workers == shards") {
  Cluster cluster{2, 2};  // W/S = 1: the worker's link and the shard's carry the same
  auto t = PredictStep("bsp", HandCodec(), HandLink(), cluster, 0.010);
  REQUIRE(t.ok());
  // codec: push encode 0.5 + pull decode 0.3 + W/S = 1 x (push decode 0.1 +
  // pull encode 0.2 + the view's decode 0.3) = 1.4 ms
  CHECK(t->codec_s == Approx(0.0014));
  // comm: 1 ms up + 2 ms down + 2 x 1 ms round trips = 5 ms
  CHECK(t->comm_s == Approx(0.005));
  CHECK(t->rtt_s == Approx(0.002));
  CHECK(t->compute_s == Approx(0.010));
  CHECK(t->cpu_bound_s == 0);  // no shared cores
  CHECK(t->step_s == Approx(0.0164));
}

TEST_CASE("PredictStep: more workers than shards, the shards' links set the time") {
  Cluster cluster{4, 1};  // the one shard carries 4 workers' bytes
  auto t = PredictStep("bsp", HandCodec(), HandLink(), cluster, 0.010);
  REQUIRE(t.ok());
  // push 4 x 1 ms, pull 4 x 2 ms, + 2 ms round trips = 14 ms
  CHECK(t->comm_s == Approx(0.014));
  // codec: 0.5 + 0.3 + 4 x (0.1 + 0.2 + 0.3) = 3.2 ms
  CHECK(t->codec_s == Approx(0.0032));
  CHECK(t->step_s == Approx(0.0272));
  // Fewer workers than shards: the worker's own link is the slower side.
  auto few = PredictStep("bsp", HandCodec(), HandLink(), Cluster{1, 4}, 0.010);
  REQUIRE(few.ok());
  CHECK(few->comm_s == Approx(0.005));
}

TEST_CASE("PredictStep: ssp2 and asp overlap comm with compute; local4 a quarter") {
  Cluster cluster{2, 2};
  // Compute-bound: the step is compute + codec, comm hides behind it.
  auto ssp = PredictStep("ssp2", HandCodec(), HandLink(), cluster, 0.010);
  REQUIRE(ssp.ok());
  CHECK(ssp->step_s == Approx(0.0114));
  // Comm-bound (compute 1 ms): the step is the 5 ms of comm.
  auto asp = PredictStep("asp", HandCodec(), HandLink(), cluster, 0.001);
  REQUIRE(asp.ok());
  CHECK(asp->step_s == Approx(0.005));
  auto local = PredictStep("local4", HandCodec(), HandLink(), cluster, 0.010);
  REQUIRE(local.ok());
  CHECK(local->comm_s == Approx(0.00125));
  CHECK(local->codec_s == Approx(0.00035));
  CHECK(local->step_s == Approx(0.0116));
}

TEST_CASE("PredictStep: dense pulls cost the shard nothing beyond the push's decode") {
  CodecCost dense = HandCodec();
  dense.encode_pull_s = 0;
  dense.decode_pull_s = 0;
  auto t = PredictStep("bsp", dense, HandLink(), Cluster{4, 2}, 0.010);
  REQUIRE(t.ok());
  CHECK(t->codec_s == Approx(0.0007));  // 0.5 + 2 x 0.1
}

TEST_CASE("PredictStep: on shared cores the cluster's CPU work bounds the step") {
  Link link = HandLink();
  link.cpu_s_per_byte = 1e-7;  // 0.1 us per byte at each end
  link.cpu_s_per_call = 1e-4;  // 0.1 ms per call at each end
  CodecCost codec = HandCodec();
  codec.chunks = 2;
  // A worker's round on the cores: codecs 0.5 + 0.3 + 0.1 + (0.2 + 0.3),
  // transport 2 ends x (5000 bytes x 0.1 us + 2 calls x 0.1 ms) = 1.4 ms:
  // 2.8 ms. Four workers' steps of 10 ms compute each on 2 cores:
  // 4 x (10 + 2.8) / 2 = 25.6 ms.
  Cluster shared{4, 2, 2};
  auto bsp = PredictStep("bsp", codec, link, shared, 0.010);
  REQUIRE(bsp.ok());
  CHECK(bsp->cpu_bound_s == Approx(0.0256));
  CHECK(bsp->codec_s == Approx(0.0020));  // 0.5 + 0.3 + 2 x (0.1 + 0.5)
  CHECK(bsp->comm_s == Approx(0.008));    // 2 x 1 + 2 x 2 + 2 round trips
  CHECK(bsp->step_s == Approx(0.0336));   // the bound, then the wire
  auto asp = PredictStep("asp", codec, link, shared, 0.010);
  REQUIRE(asp.ok());
  CHECK(asp->step_s == Approx(0.0256));  // the wire hides behind the cores
  auto local = PredictStep("local4", codec, link, shared, 0.010);
  REQUIRE(local.ok());
  CHECK(local->cpu_bound_s == Approx(0.0214));  // 4 x (10 + 2.8 / 4) / 2
  CHECK(local->step_s == Approx(0.0234));       // + 8 / 4 ms of wire
  // The same job with cores of its own: compute + codec + comm.
  auto own = PredictStep("bsp", codec, link, Cluster{4, 2, 0}, 0.010);
  REQUIRE(own.ok());
  CHECK(own->cpu_bound_s == 0);
  CHECK(own->step_s == Approx(0.020));
  // Enough shared cores, and the bound no longer binds.
  auto roomy = PredictStep("bsp", codec, link, Cluster{4, 2, 64}, 0.010);
  REQUIRE(roomy.ok());
  CHECK(roomy->cpu_bound_s == Approx(0.0008));
  CHECK(roomy->step_s == Approx(0.020));
}

TEST_CASE("PredictStep: bytes scale the comm term linearly") {
  CodecCost big = HandCodec();
  big.push_bytes *= 10;
  big.pull_bytes *= 10;
  auto t = PredictStep("bsp", big, HandLink(), Cluster{2, 2}, 0);
  REQUIRE(t.ok());
  CHECK(t->comm_s == Approx(0.032));  // 10 + 20 + 2 ms
}

TEST_CASE("PredictStep: bad inputs are refused") {
  CHECK(!PredictStep("bsp2", HandCodec(), HandLink(), Cluster{2, 2}, 0).ok());
  Link dead = HandLink();
  dead.up_bytes_per_s = 0;
  CHECK(!PredictStep("bsp", HandCodec(), dead, Cluster{2, 2}, 0).ok());
  CHECK(!PredictStep("bsp", HandCodec(), HandLink(), Cluster{0, 2}, 0).ok());
  CHECK(!PredictStep("bsp", HandCodec(), HandLink(), Cluster{2, 2}, -1).ok());
  CHECK(!PredictStep("bsp", HandCodec(), HandLink(), Cluster{2, 2, -1}, 0).ok());
  Link negative = HandLink();
  negative.cpu_s_per_byte = -1e-9;
  CHECK(!PredictStep("bsp", HandCodec(), negative, Cluster{2, 2, 2}, 0).ok());
}

CalibrationRun Run(const std::string& sync, const std::string& codec, const std::string& pulls,
                   double link, double steps) {
  CalibrationRun run;
  run.sync = sync;
  run.codec = codec;
  run.pulls = pulls;
  run.link_gbps = link;
  run.steps_to_target = steps;
  return run;
}

TEST_CASE("EstimateSteps: grid median, never reached, survey guess") {
  Calibration calibration;
  calibration.model = "mlp";
  calibration.runs = {Run("bsp", "none", "off", 1, 400), Run("bsp", "none", "off", 10, 440),
                      Run("bsp", "topk", "off", 1, 500), Run("bsp", "topk", "off", 10, 600),
                      Run("bsp", "topk", "off", 0, 520), Run("asp", "signsgd", "off", 1, -1),
                      Run("asp", "signsgd", "off", 10, -1)};
  auto median_even = EstimateSteps(&calibration, "bsp", "none", "off", 350);
  CHECK(median_even.source == StepsSource::kCalibration);
  CHECK(median_even.steps == Approx(420));
  auto median_odd = EstimateSteps(&calibration, "bsp", "topk", "off", 350);
  CHECK(median_odd.steps == Approx(520));
  auto never = EstimateSteps(&calibration, "asp", "signsgd", "off", 350);
  CHECK(never.source == StepsSource::kNeverReached);
  CHECK(never.steps == -1);
  // Missing from the grid: the grid's bsp/none/off (420) x the factors.
  auto missing = EstimateSteps(&calibration, "ssp2", "fp16", "on", 350);
  CHECK(missing.source == StepsSource::kSurveyGuess);
  CHECK(missing.steps ==
        Approx(420 * SyncFactor("ssp2") * CodecFactor("fp16") * kCompressedPullFactor));
  // No grid: the built-in base.
  auto guess = EstimateSteps(nullptr, "local4", "topk", "off", 350);
  CHECK(guess.source == StepsSource::kSurveyGuess);
  CHECK(guess.steps == Approx(350 * SyncFactor("local4") * CodecFactor("topk")));
  CHECK(guess.note.find("survey guess") != std::string::npos);
}

OptionResult Option(const std::string& sync, const std::string& codec, double step_s,
                    double steps, StepsSource source = StepsSource::kCalibration) {
  OptionResult o;
  o.sync = sync;
  o.codec = codec;
  o.pulls = "off";
  o.terms.step_s = step_s;
  o.steps.steps = steps;
  o.steps.source = source;
  return o;
}

TEST_CASE("RankOptions: least time first, never-reached last, ties in grid order") {
  std::vector<OptionResult> options = {
      Option("bsp", "none", 0.010, 100),                           // 1.0 s
      Option("asp", "signsgd", 0.001, -1, StepsSource::kNeverReached),
      Option("bsp", "topk", 0.004, 200),                           // 0.8 s
      Option("local4", "fp16", 0.004, 200),                        // 0.8 s: tie, after bsp
      Option("ssp2", "qsgd8", 0.020, 100),                         // 2.0 s
  };
  RankOptions(&options);
  REQUIRE(options.size() == 5);
  CHECK(options[0].codec == "topk");
  CHECK(options[0].time_to_target_s == Approx(0.8));
  CHECK(options[1].sync == "local4");
  CHECK(options[2].codec == "none");
  CHECK(options[3].codec == "qsgd8");
  CHECK(options[4].codec == "signsgd");
  CHECK(options[4].time_to_target_s == -1);
}

TEST_CASE("ParseCalibration: ok runs of the model, pulls from the run id, one-line errors") {
  const std::string text =
      "{\"bench\":\"convergence\",\"run_id\":\"mlp-bsp-topk-pullon-1g\",\"model\":\"mlp\","
      "\"sync\":\"bsp\",\"codec\":\"topk\",\"codec_spec\":\"topk:ratio=0.01\","
      "\"pull_codec\":\"topk:ratio=0.1\",\"link_gbps\":1,\"steps_to_target\":240,"
      "\"step_s\":0.01,\"time_to_target_s\":2.4,\"status\":\"ok\",\"error\":\"\"}\n"
      "\n"
      "{\"run_id\":\"mlp-asp-none-pulloff-10g\",\"model\":\"mlp\",\"sync\":\"asp\","
      "\"codec\":\"none\",\"steps_to_target\":-1,\"status\":\"ok\"}\n"
      "{\"run_id\":\"mlp-bsp-none-pulloff-1g\",\"model\":\"mlp\",\"sync\":\"bsp\","
      "\"codec\":\"none\",\"steps_to_target\":100,\"status\":\"failed\"}\n"
      "{\"run_id\":\"cnn-bsp-none-pulloff-1g\",\"model\":\"cnn\",\"sync\":\"bsp\","
      "\"codec\":\"none\",\"steps_to_target\":300,\"status\":\"ok\"}\n";
  auto calibration = ParseCalibration(text, "mlp");
  INFO(calibration.status().ToString());
  REQUIRE(calibration.ok());
  REQUIRE(calibration->runs.size() == 2);
  CHECK(calibration->runs[0].pulls == "on");
  CHECK(calibration->runs[0].pull_codec == "topk:ratio=0.1");
  CHECK(calibration->runs[0].codec_spec == "topk:ratio=0.01");
  CHECK(calibration->runs[0].steps_to_target == 240);
  CHECK(calibration->runs[0].link_gbps == 1);
  CHECK(calibration->runs[1].pulls == "off");
  CHECK(calibration->runs[1].steps_to_target == -1);

  auto bad = ParseCalibration("{\"run_id\": 1,\n not json\n", "mlp");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message() == "calibration line 1 is not a JSON object");
  auto missing = ParseCalibration("{\"run_id\":\"x\",\"model\":\"mlp\"}\n", "mlp");
  REQUIRE(!missing.ok());
  CHECK(missing.status().message() == "calibration line 1 has no \"sync\"");
  auto other = ParseCalibration(text, "replay:vgg16");
  REQUIRE(!other.ok());
  CHECK(absl::IsNotFound(other.status()));
}

TEST_CASE("The grid's names and specs") {
  CHECK(SyncNames() == std::vector<std::string>{"bsp", "ssp2", "asp", "local4"});
  CHECK(CodecNames().size() == 13);
  CHECK(*CodecSpecFor("qsgd8") == "qsgd:levels=127,bucket=512");
  CHECK(*CodecSpecFor("powersgd2") == "powersgd:rank=2");
  CHECK(absl::IsNotFound(CodecSpecFor("zip").status()));
  // The grid's own specs and pull codecs (what harrier-bench convergence runs).
  CHECK(*CodecSpecFor("randomk") == "randomk:ratio=0.01,scale=0");
  CHECK(*PullCodecSpecFor("dgc") == "topk:ratio=0.1");
  CHECK(*PullCodecSpecFor("qsgd8") == "fp16");
  CHECK(absl::IsNotFound(PullCodecSpecFor("zip").status()));
  // Every codec name has its factor and rate, in the survey table's order.
  REQUIRE(CodecNames().size() == SurveyCodecs().size());
  for (size_t i = 0; i < CodecNames().size(); ++i) {
    CHECK(CodecNames()[i] == SurveyCodecs()[i].name);
    CHECK(CodecRate(CodecNames()[i]) != "?");
  }
}

}  // namespace
}  // namespace harrier::advise
