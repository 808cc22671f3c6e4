// FlagSet: parsing into typed options, errors naming the flag, unknown flags with a
// suggestion, exclusive pairs, rendering for forwarding, nested option structs, FieldError,
// short spellings.
#include "common/flags.h"

#include "gtest/gtest.h"

namespace recall::flags {
namespace {

struct Inner {
  int window = 32;
  std::optional<double> fraction;
  std::string policy = "full";
};

struct Options {
  int64_t threads = 0;
  std::optional<int64_t> kv_bytes;
  bool graphs = true;
  std::vector<int> devices;
  std::string device = "cpu";
  Inner inner;
};

FlagSet<Inner> InnerFlags() {
  FlagSet<Inner> f;
  f.Section("cache")
      .Int(
          "window", "W", "eviction window", [](auto& o) -> auto& { return o.window; }, 1, 1024)
      .Double(
          "budget-frac", "F", "fraction", [](auto& o) -> auto& { return o.fraction; }, kAboveZero,
          1)
      .Field("budget_fraction")
      .Choice("policy", "NAME", "policy", [](auto& o) -> auto& { return o.policy; },
              {"full", "lazy"});
  return f;
}

FlagSet<Options> OptionFlags() {
  FlagSet<Options> f;
  f.Section("engine")
      .Int(
          "threads", "N", "threads", [](auto& o) -> auto& { return o.threads; }, 0, 1024)
      .Bytes(
          "kv-cache-bytes", "SIZE", "pool", [](auto& o) -> auto& { return o.kv_bytes; }, 1)
      .Field("kv_bytes")
      .Switch(
          "no-cuda-graphs", "graphs off", [](auto& o) -> auto& { return o.graphs; }, false)
      .Value(
          "devices", "LIST", "ordinals", [](auto& o) -> auto& { return o.devices; }, 0, 64)
      .Choice("device", "NAME", "device", [](auto& o) -> auto& { return o.device; },
              {"cpu", "cuda"})
      .Include(
          InnerFlags(), [](auto& o) -> auto& { return o.inner; })
      .Exclusive("threads", "budget-frac");
  return f;
}

TEST(FlagSetTest, ParsesEveryTypeIntoTheOptions) {
  Options o;
  std::set<std::string> given;
  ASSERT_TRUE(
      OptionFlags()
          .Parse({"--threads", "4", "--kv-cache-bytes=512M", "--no-cuda-graphs", "--devices", "0,1",
                  "--device", "cuda", "--window", "64", "--policy=lazy"},
                 &o, &given)
          .ok());
  EXPECT_EQ(o.threads, 4);
  EXPECT_EQ(o.kv_bytes, int64_t{512} << 20);
  EXPECT_FALSE(o.graphs);
  EXPECT_EQ(o.devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(o.device, "cuda");
  EXPECT_EQ(o.inner.window, 64);
  EXPECT_EQ(o.inner.policy, "lazy");
  EXPECT_FALSE(o.inner.fraction.has_value());
  EXPECT_EQ(given.count("window"), 1u);
  EXPECT_EQ(given.count("budget-frac"), 0u);
}

TEST(FlagSetTest, ErrorsNameTheFlagAndTheLimit) {
  const FlagSet<Options> f = OptionFlags();
  Options o;
  EXPECT_EQ(f.Parse({"--window", "0"}, &o).message(), "--window: must be in [1, 1024], got 0");
  EXPECT_EQ(f.Parse({"--threads", "x"}, &o).message(), "--threads: \"x\" is not an integer");
  // A range open at 0 says so (it read "[1e-06, 1]", and refused what the server takes).
  EXPECT_EQ(f.Parse({"--budget-frac", "0"}, &o).message(),
            "--budget-frac: must be in (0, 1], got 0");
  EXPECT_TRUE(f.Parse({"--budget-frac", "1e-9"}, &o).ok());
  EXPECT_EQ(f.Parse({"--budget-frac", "inf"}, &o).message(),
            "--budget-frac: \"inf\" is not a finite number");
  EXPECT_EQ(f.Parse({"--device", "tpu"}, &o).message(),
            "--device: \"tpu\" is not one of cpu, cuda");
  EXPECT_EQ(f.Parse({"--windw", "3"}, &o).message(),
            "unknown flag --windw (did you mean --window?)");
  EXPECT_EQ(f.Parse({"extra"}, &o).message(),
            "unexpected argument \"extra\": options are --name VALUE (see --help)");
  EXPECT_EQ(f.Parse({"--window"}, &o).message(), "--window needs a value (W)");
  EXPECT_EQ(f.Parse({"--no-cuda-graphs=1"}, &o).message(), "--no-cuda-graphs takes no value");
  EXPECT_EQ(f.Parse({"--threads", "2", "--budget-frac", "0.5"}, &o).message(),
            "--threads and --budget-frac are exclusive; give one");
  EXPECT_EQ(f.Parse({"--kv-cache-bytes", "12Q"}, &o).code(), absl::StatusCode::kInvalidArgument);
  // Numbers are decimal (strtod reads "0x10" as 16).
  EXPECT_EQ(f.Parse({"--budget-frac", "0x0.8"}, &o).message(),
            "--budget-frac: \"0x0.8\" is not a finite number");
  EXPECT_EQ(f.Parse({"--kv-cache-bytes", "0x100000"}, &o).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--threads", "0x2"}, &o).message(), "--threads: \"0x2\" is not an integer");
}

TEST(FlagSetTest, IntegerRangesReachTheTypesLimits) {
  struct Seeds {
    std::optional<int64_t> seed;
    size_t bytes = 0;
  };
  FlagSet<Seeds> f;
  f.Int(
       "seed", "S", "seed", [](auto& o) -> auto& { return o.seed; }, 0, INT64_MAX)
      .Int(
          "bytes", "N", "bytes", [](auto& o) -> auto& { return o.bytes; }, 1, 64 << 20);
  Seeds o;
  ASSERT_TRUE(f.Parse({"--seed", "9223372036854775807", "--bytes", "42"}, &o).ok());
  EXPECT_EQ(o.seed, INT64_MAX);
  EXPECT_EQ(o.bytes, 42u);
  EXPECT_EQ(f.Parse({"--seed", "-1"}, &o).message(),
            "--seed: must be in [0, 9223372036854775807], got -1");
  // Past int64's range: out of range, not "not an integer".
  EXPECT_EQ(f.Parse({"--seed", "99999999999999999999"}, &o).message(),
            "--seed: must be in [0, 9223372036854775807], got 99999999999999999999");
  EXPECT_EQ(f.Parse({"--bytes", "-99999999999999999999"}, &o).message(),
            "--bytes: must be in [1, 67108864], got -99999999999999999999");
}

// An empty string is refused (an unset shell variable in --api-keys "$KEYS" turned the keys
// off); a Text may be empty (a prompt).
TEST(FlagSetTest, AnEmptyStringIsRefusedUnlessTheFlagIsText) {
  struct Paths {
    std::string keys;
    std::optional<std::string> ca;
    std::string prompt = "Once";
  };
  FlagSet<Paths> f;
  f.String(
       "api-keys", "FILE", "keys", [](auto& o) -> auto& { return o.keys; })
      .String(
          "tls-ca", "FILE", "ca", [](auto& o) -> auto& { return o.ca; })
      .Text(
          "prompt", "TEXT", "prompt", [](auto& o) -> auto& { return o.prompt; });
  Paths o;
  EXPECT_EQ(f.Parse({"--api-keys", ""}, &o).message(),
            "--api-keys: empty; omit the flag for its default");
  EXPECT_EQ(f.Parse({"--tls-ca="}, &o).message(), "--tls-ca: empty; omit the flag for its default");
  ASSERT_TRUE(f.Parse({"--prompt", ""}, &o).ok());
  EXPECT_EQ(o.prompt, "");
  EXPECT_EQ(f.Render(o), (std::vector<std::string>{"--prompt", ""}));
}

TEST(FlagSetTest, RenderReproducesTheNonDefaultOptions) {
  const FlagSet<Options> f = OptionFlags();
  Options o;
  EXPECT_TRUE(f.Render(o).empty());
  ASSERT_TRUE(f.Parse({"--kv-cache-bytes", "1K", "--no-cuda-graphs", "--devices", "2,3",
                       "--budget-frac", "0.25", "--policy", "lazy"},
                      &o)
                  .ok());
  const std::vector<std::string> argv = f.Render(o);
  EXPECT_EQ(argv,
            (std::vector<std::string>{"--kv-cache-bytes", "1024", "--no-cuda-graphs", "--devices",
                                      "2,3", "--budget-frac", "0.25", "--policy", "lazy"}));
  Options back;
  ASSERT_TRUE(f.Parse(argv, &back).ok());
  EXPECT_EQ(back.kv_bytes, o.kv_bytes);
  EXPECT_EQ(back.devices, o.devices);
  EXPECT_EQ(back.inner.fraction, o.inner.fraction);
  EXPECT_EQ(back.graphs, o.graphs);
}

TEST(FlagSetTest, ExplainNamesTheFlagOfAFieldError) {
  const FlagSet<Options> f = OptionFlags();
  const absl::Status st = FieldError("budget_fraction", "too small for one block");
  EXPECT_EQ(st.message(), "budget_fraction: too small for one block");
  EXPECT_EQ(FieldOf(st), "budget_fraction");
  EXPECT_EQ(f.Explain(st).message(), "--budget-frac: too small for one block");
  EXPECT_EQ(f.Explain(FieldError("kv_bytes", "x")).message(), "--kv-cache-bytes: x");
  EXPECT_EQ(f.Explain(absl::InternalError("plain")).message(), "plain");
}

TEST(FlagSetTest, HelpListsEveryFlagBySection) {
  const std::string help = OptionFlags().Help();
  EXPECT_NE(help.find("engine:\n  --threads N"), std::string::npos) << help;
  EXPECT_NE(help.find("cache:\n  --window W"), std::string::npos) << help;
  EXPECT_NE(help.find("--no-cuda-graphs"), std::string::npos);
}

TEST(FlagSetTest, ShortSpellingsStandForTheirFlags) {
  FlagSet<Options> f = OptionFlags();
  f.Short('t', "threads").Short('w', "window");
  Options o;
  std::set<std::string> given;
  ASSERT_TRUE(f.Parse({"-t", "4", "-w", "64"}, &o, &given).ok());
  EXPECT_EQ(o.threads, 4);
  EXPECT_EQ(o.inner.window, 64);
  EXPECT_EQ(given, (std::set<std::string>{"threads", "window"}));
  const absl::Status bad = f.Parse({"-x", "1"}, &o);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("unknown flag -x (short flags here: -t -w)"), std::string::npos)
      << bad.message();
  EXPECT_NE(f.Help().find("-t, --threads N"), std::string::npos) << f.Help();
  EXPECT_NE(f.Parse({"-t", "0x"}, &o).message().find("--threads"), std::string::npos)
      << "errors name the long flag";
  // -x=VALUE as --name=VALUE takes it (it was refused as an unexpected argument).
  ASSERT_TRUE(f.Parse({"-t=3"}, &o).ok());
  EXPECT_EQ(o.threads, 3);
  EXPECT_NE(f.Parse({"-x=1"}, &o).message().find("unknown flag -x (short flags here"),
            std::string::npos);
}

}  // namespace
}  // namespace recall::flags
