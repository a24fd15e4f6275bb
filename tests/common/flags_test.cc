// harrier::ParseFlags in a real process (flags_probe, which prints its flags):
// flagfiles (--flagfile, its alias --config, HARRIER_CONFIG), HARRIER_<NAME>
// variables, their precedence, --help and the errors.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Outcome {
  int status = -1;  // exit status
  std::string out;
  std::string err;
};

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Probe() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "harrier") + "/tests/common/flags_probe";
}

std::string Quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string ReadAll(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Runs flags_probe in an environment of only `env` (NAME=value entries).
Outcome Run(const std::vector<std::string>& env, const std::vector<std::string>& args) {
  std::string command = "env -i";
  for (const std::string& entry : env) command += " " + Quote(entry);
  command += " " + Quote(Probe());
  for (const std::string& arg : args) command += " " + Quote(arg);
  const std::string out = TempDir() + "/probe.out";
  const std::string err = TempDir() + "/probe.err";
  const int status = std::system((command + " >" + out + " 2>" + err).c_str());
  Outcome outcome;
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  outcome.out = ReadAll(out);
  outcome.err = ReadAll(err);
  return outcome;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

int Lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

TEST_CASE("defaults without any source") {
  const Outcome o = Run({}, {});
  CHECK(o.status == 0);
  CHECK(o.out == "steps=1\nlabel=none\nverbose=0\nrate=0.5\nargs=\n");
  CHECK(o.err.empty());
}

TEST_CASE("a flagfile sets flags: --flagfile, its alias --config, HARRIER_CONFIG") {
  const std::string file =
      WriteFile("set.flags", "# a comment\n--steps=3\n\n  --label=from_file\n--verbose\n");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--flagfile=" + file}, {"--config=" + file}, {"--config", file}}) {
    const Outcome o = Run({}, args);
    CHECK(o.status == 0);
    CHECK(Has(o.out, "steps=3\nlabel=from_file\nverbose=1\n"));
  }
  const Outcome env = Run({"HARRIER_CONFIG=" + file}, {});
  CHECK(env.status == 0);
  CHECK(Has(env.out, "steps=3\nlabel=from_file\n"));
}

TEST_CASE("HARRIER_<NAME> sets the flag of that name") {
  const Outcome o = Run({"HARRIER_STEPS=4", "HARRIER_RATE=0.125", "HARRIER_VERBOSE=true"}, {});
  CHECK(o.status == 0);
  CHECK(o.out == "steps=4\nlabel=none\nverbose=1\nrate=0.125\nargs=\n");
  CHECK(o.err.empty());
}

TEST_CASE("the command line beats the environment, which beats the file") {
  const std::string file = WriteFile("all.flags", "--steps=3\n--label=file\n--rate=0.25\n");
  // The file is read first wherever --flagfile stands on the command line.
  const Outcome o =
      Run({"HARRIER_STEPS=4", "HARRIER_LABEL=env"}, {"--label=command_line", "--flagfile=" + file});
  CHECK(o.status == 0);
  CHECK(o.out == "steps=4\nlabel=command_line\nverbose=0\nrate=0.25\nargs=\n");
  // A file on the command line replaces HARRIER_CONFIG's.
  const std::string other = WriteFile("other.flags", "--rate=0.75\n");
  const Outcome replaced = Run({"HARRIER_CONFIG=" + other}, {"--config=" + file});
  CHECK(Has(replaced.out, "rate=0.25\n"));
}

TEST_CASE("a HARRIER_ variable that names no flag is ignored, in one line") {
  const Outcome o =
      Run({"HARRIER_TEST_SLOWDOWN=3", "HARRIER_NUM_WORKERS=2", "HARRIER_STEPS=6"}, {});
  CHECK(o.status == 0);
  CHECK(Has(o.out, "steps=6\n"));
  CHECK(
      o.err ==
      "flags_probe: ignoring HARRIER_NUM_WORKERS, HARRIER_TEST_SLOWDOWN (no flag of flags_probe by "
      "that name)\n");
  // Only the upper-case spelling is a flag's variable; absl's help flags are
  // never set from the environment.
  const Outcome lower = Run({"HARRIER_steps=6", "HARRIER_HELP=1"}, {});
  CHECK(lower.status == 0);
  CHECK(Has(lower.out, "steps=1\n"));
  CHECK(Has(lower.err, "ignoring HARRIER_HELP, HARRIER_steps"));
}

TEST_CASE("--help lists the binary's own flags and exits 0") {
  for (const char* help : {"--help", "-help", "-h", "--helpshort"}) {
    const Outcome o = Run({}, {help});
    CHECK(o.status == 0);
    CHECK(Has(o.out, "flags_probe: prints its flags.\nUsage: flags_probe"));
    CHECK(Has(o.out, "    --steps (Steps to run.); default: 1;\n"));
    CHECK(Has(o.out, "    --label (A label.); default: \"none\";\n"));
    CHECK(Has(o.out, "    --config ("));
    CHECK_FALSE(Has(o.out, "--undefok"));  // absl's own: --helpfull
    CHECK_FALSE(Has(o.out, "steps="));     // it exits before main goes on
  }
  const Outcome full = Run({"HARRIER_STEPS=9"}, {"--helpfull"});
  CHECK(full.status == 0);
  CHECK(Has(full.out, "--undefok"));
  CHECK(Has(full.out, "--steps (Steps to run.); default: 1; currently: 9;"));
}

TEST_CASE("arguments that are not flags come back in order") {
  const Outcome o = Run({}, {"first", "--steps", "8", "second", "--", "--steps=9", "-h"});
  CHECK(o.status == 0);
  CHECK(Has(o.out, "steps=8\n"));
  CHECK(Has(o.out, "args=first,second,--steps=9,-h\n"));
}

TEST_CASE("a bad value fails with one line naming its source") {
  const Outcome command_line = Run({}, {"--steps=many"});
  CHECK(command_line.status != 0);
  CHECK(Lines(command_line.err) == 1);
  CHECK(Has(command_line.err, "'many'"));
  CHECK(Has(command_line.err, "'steps'"));

  const Outcome env = Run({"HARRIER_STEPS=many"}, {});
  CHECK(env.status == 2);
  CHECK(env.err ==
        "flags_probe: HARRIER_STEPS: bad value 'many' for --steps: Illegal value 'many' specified "
        "for flag 'steps'\n");

  const std::string file = WriteFile("bad_value.flags", "--label=ok\n--rate=fast\n");
  const Outcome from_file = Run({}, {"--flagfile=" + file});
  CHECK(from_file.status == 2);
  CHECK(Lines(from_file.err) == 1);
  CHECK(Has(from_file.err, file + ":2: bad value 'fast' for --rate"));
}

TEST_CASE("flagfile mistakes name the file and line") {
  const std::string unknown = WriteFile("unknown.flags", "--steps=2\n--bogus_setting=1\n");
  const Outcome o = Run({}, {"--config=" + unknown});
  CHECK(o.status == 2);
  CHECK(o.err == "flags_probe: " + unknown + ":2: unknown flag 'bogus_setting'\n");

  const std::string old_style = WriteFile("old_style.conf", "steps = 2\n");
  const Outcome old = Run({}, {"--config=" + old_style});
  CHECK(old.status == 2);
  CHECK(old.err ==
        "flags_probe: " + old_style +
            ":1: 'steps = 2' is not a flag (a flagfile holds one --name=value a line)\n");

  const Outcome missing = Run({}, {"--flagfile=/nonexistent/x.flags"});
  CHECK(missing.status == 2);
  CHECK(missing.err == "flags_probe: cannot read flagfile /nonexistent/x.flags\n");

  const Outcome unknown_flag = Run({}, {"--bogus=1"});
  CHECK(unknown_flag.status != 0);
  CHECK(Lines(unknown_flag.err) == 1);
  CHECK(Has(unknown_flag.err, "'bogus'"));
}

}  // namespace
