// mlakit-run's command line (apps/run_options.h): every flag parsed strictly, each bad value an
// InvalidArgument naming the flag, the expected range and the value given; and the problem
// the CPU reference runs without a GPU, never a silent substitute.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/run_options.h"
#include "cpu_test_util.h"

namespace mlakit::app {
namespace {

using testing::IsInvalid;

Status parse(std::vector<std::string> flags, RunOptions* o) {
  std::vector<const char*> argv = {"mlakit-run"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  return parse_run_options(static_cast<int>(argv.size()), argv.data(), o);
}

TEST(RunFlags, NoFlagsGiveTheGpuDefaultProblem) {
  RunOptions o;
  o.b = -1;
  ASSERT_TRUE(parse({}, &o));
  EXPECT_EQ(o.b, 64);
  EXPECT_EQ(o.s_q, 1);
  EXPECT_EQ(o.h_q, 128);
  EXPECT_EQ(o.h_kv, 1);
  EXPECT_EQ(o.s_k, 4096);
  EXPECT_EQ(o.page, 64);
  EXPECT_TRUE(o.varlen);
  EXPECT_FALSE(o.causal || o.force_cpu || o.help || o.problem_given);
  EXPECT_EQ(o.dtype, DType::kBF16);
}

TEST(RunFlags, EveryFlagIsRead) {
  RunOptions o;
  ASSERT_TRUE(parse({"--b", "3", "--s_q", "2", "--h_q", "48", "--h_kv", "16", "--s_k", "268435456", "--page", "1",
                     "--causal", "--fixed", "--fp16", "--cpu"},
                    &o));
  EXPECT_EQ(o.b, 3);
  EXPECT_EQ(o.s_q, 2);
  EXPECT_EQ(o.h_q, 48);
  EXPECT_EQ(o.h_kv, 16);
  EXPECT_EQ(o.s_k, 1 << 28);
  EXPECT_EQ(o.page, 1);
  EXPECT_TRUE(o.causal && !o.varlen && o.force_cpu && o.problem_given);
  EXPECT_EQ(o.dtype, DType::kFP16);
  ASSERT_TRUE(parse({"--help"}, &o));
  EXPECT_TRUE(o.help);
  ASSERT_TRUE(parse({"-h"}, &o));
  EXPECT_TRUE(o.help);
}

TEST(RunFlags, ValuesMustBeWholeIntegersInRange) {
  const struct {
    const char* flag;
    const char* value;
    const char* range;
  } cases[] = {
      {"--b", "0", "[1, 1048576]"},         {"--b", "abc", "[1, 1048576]"},
      {"--b", "4x", "[1, 1048576]"},        {"--b", "", "[1, 1048576]"},
      {"--b", "-3", "[1, 1048576]"},        {"--b", "+3", "[1, 1048576]"},
      {"--b", " 3", "[1, 1048576]"},        {"--b", "3.0", "[1, 1048576]"},
      {"--b", "1048577", "[1, 1048576]"},   {"--s_q", "0", "[1, 1024]"},
      {"--s_q", "1025", "[1, 1024]"},       {"--h_q", "0", "[1, 1024]"},
      {"--h_kv", "-1", "[1, 1024]"},        {"--s_k", "0", "[1, 268435456]"},
      {"--s_k", "99999999999999999999", "[1, 268435456]"},
      {"--page", "0", "[1, 1073741824]"},   {"--page", "0x40", "[1, 1073741824]"},
  };
  for (const auto& c : cases) {
    RunOptions o;
    EXPECT_TRUE(IsInvalid(parse({c.flag, c.value}, &o), {std::string("mlakit-run: ") + c.flag + ": expected an integer in " +
                                                             c.range + ", got \"" + c.value + "\""}))
        << c.flag << " " << c.value;
  }
}

TEST(RunFlags, MissingValuesAndUnknownOptionsAreNamed) {
  RunOptions o;
  EXPECT_TRUE(IsInvalid(parse({"--causal", "--page"}, &o), {"--page: expected a value, got none"}));
  EXPECT_TRUE(IsInvalid(parse({"--bb", "3"}, &o), {"unknown option \"--bb\""}));
  EXPECT_TRUE(IsInvalid(parse({"4"}, &o), {"unknown option \"4\""}));
  EXPECT_TRUE(IsInvalid(parse({"--b=4"}, &o), {"unknown option \"--b=4\""}));
}

TEST(RunFlags, HkvMustDivideHq) {
  RunOptions o;
  EXPECT_TRUE(IsInvalid(parse({"--h_q", "16", "--h_kv", "3"}, &o), {"--h_kv: expected a divisor of h_q (16), got 3"}));
  EXPECT_TRUE(IsInvalid(parse({"--h_kv", "3"}, &o), {"--h_kv", "h_q (128)", "got 3"}));
  EXPECT_TRUE(parse({"--h_q", "16", "--h_kv", "4"}, &o));
}

TEST(RunFlags, UsageListsEveryFlag) {
  const std::string usage = run_usage();
  for (const char* flag : {"--b", "--s_q", "--h_q", "--h_kv", "--s_k", "--page", "--causal", "--fixed", "--fp16", "--cpu",
                           "--help"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
}

TEST(RunFlags, WithoutProblemFlagsTheCpuRunsTheSmallProblemAndSaysSo) {
  RunOptions o;
  ASSERT_TRUE(parse({"--fp16"}, &o));
  const CpuProblem p = choose_cpu_problem(o);
  EXPECT_EQ(p.options.b, 4);
  EXPECT_EQ(p.options.s_q, 2);
  EXPECT_EQ(p.options.h_q, 16);
  EXPECT_EQ(p.options.s_k, 300);
  EXPECT_TRUE(p.options.causal);
  EXPECT_EQ(p.options.dtype, DType::kFP16);
  EXPECT_NE(p.note.find("too large for the CPU reference"), std::string::npos) << p.note;
  EXPECT_NE(p.note.find(describe_problem(p.options)), std::string::npos) << p.note;
}

TEST(RunFlags, ASmallRequestedProblemRunsAsGiven) {
  RunOptions o;
  ASSERT_TRUE(parse({"--b", "2", "--s_q", "3", "--s_k", "100", "--h_q", "8", "--causal"}, &o));
  const CpuProblem p = choose_cpu_problem(o);
  EXPECT_EQ(describe_problem(p.options), describe_problem(o));
  EXPECT_EQ(p.note, "running the requested problem");
}

TEST(RunFlags, ALargeRequestedProblemIsReducedAndBothAreNamed) {
  RunOptions o;
  ASSERT_TRUE(parse({"--s_q", "3"}, &o));  // b=64 s_k~4096 h_q=128 with s_q=3: 219 GFLOP
  const CpuProblem p = choose_cpu_problem(o);
  EXPECT_EQ(p.options.s_q, 3);
  EXPECT_EQ(p.options.h_q, 128);
  EXPECT_EQ(p.options.b, 4);
  EXPECT_EQ(p.options.s_k, 300);
  EXPECT_NE(p.note.find("the requested problem (" + describe_problem(o) + ")"), std::string::npos) << p.note;
  EXPECT_NE(p.note.find("running " + describe_problem(p.options) + " instead"), std::string::npos) << p.note;

  ASSERT_TRUE(parse({"--s_q", "1024", "--h_q", "1024"}, &o));  // too large even reduced
  const CpuProblem q = choose_cpu_problem(o);
  EXPECT_EQ(q.options.s_q, 2);
  EXPECT_EQ(q.options.h_q, 16);
  EXPECT_NE(q.note.find("running " + describe_problem(q.options) + " instead"), std::string::npos) << q.note;
  EXPECT_LE(problem_flops(q.options), kCpuFlopLimit);
}

TEST(RunFlags, HostMemoryOfTheProblemIsChecked) {
  RunOptions o;
  ASSERT_TRUE(parse({"--page", "1073741824"}, &o));  // 3 spare blocks of 2^30 rows alone: 3.4 TiB
  EXPECT_TRUE(IsInvalid(check_host_memory(o, 64.0 * (1 << 30)), {"problem size", "64.0 GiB", "--page"}));
  ASSERT_TRUE(parse({}, &o));
  EXPECT_TRUE(check_host_memory(o, 64.0 * (1 << 30)));
}

}  // namespace
}  // namespace mlakit::app
