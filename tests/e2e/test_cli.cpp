// The `veloxquant` command line, run as a program: conventions (--help, --version, error format
// and exit status) and the calibrate → inspect → demo flow on small shapes. The executable is
// looked up next to the test binary's folder (build/veloxquant for build/tests/vq_test_e2e);
// the tests skip, saying so, when it has not been built.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "veloxquant/artifact.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/synthetic.h"

using namespace veloxquant;
namespace fs = std::filesystem;

namespace {

std::string cli_path() {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const fs::path& p : {self.parent_path().parent_path() / "veloxquant", self.parent_path() / "veloxquant"})
    if (fs::exists(p)) return p.string();
  return {};
}

struct CliRun {
  int status = -1;
  std::string out;
};

CliRun run(const std::string& args) {
  CliRun r;
  const std::string cmd = "'" + cli_path() + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("vq_cli_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

#define REQUIRE_CLI()                                                                     \
  if (cli_path().empty()) GTEST_SKIP() << "the veloxquant executable is not built next to this test"

}  // namespace

TEST(Cli, Conventions) {
  REQUIRE_CLI();
  CliRun v = run("--version");
  EXPECT_EQ(v.status, 0);
  EXPECT_NE(v.out.find("veloxquant "), std::string::npos) << v.out;
  for (const char* sub : {"calibrate", "inspect", "demo", "bench", "info"}) {
    CliRun h = run(std::string(sub) + " --help");
    EXPECT_EQ(h.status, 0) << sub;
    EXPECT_NE(h.out.find("Usage"), std::string::npos) << sub << ": " << h.out;
  }
  CliRun bad = run("frobnicate");
  EXPECT_NE(bad.status, 0);
  EXPECT_EQ(bad.out.rfind("veloxquant: error: ", 0), 0u) << bad.out;
  CliRun missing = run("inspect /nonexistent/file.safetensors");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("veloxquant: error: "), std::string::npos) << missing.out;
  CliRun badspec = run("calibrate --kv /dev/null --keys d3b8 -o /tmp/x.safetensors");
  EXPECT_NE(badspec.status, 0);
  EXPECT_NE(badspec.out.find("veloxquant: error: "), std::string::npos) << badspec.out;
  // A file that is not safetensors: a format error naming the file, status 1.
  const std::string dir = tmp_dir();
  const std::string junk = dir + "/junk.safetensors";
  FILE* f = std::fopen(junk.c_str(), "wb");
  std::fputs("this is not a safetensors file at all", f);
  std::fclose(f);
  CliRun j = run("inspect " + junk);
  EXPECT_EQ(j.status, 1) << j.out;
  EXPECT_NE(j.out.find("veloxquant: error: " + junk), std::string::npos) << j.out;
}

// `info` answers from cuda_support (tests/unit/test_cuda_support.cpp checks the rule): the JSON
// carries the build, the compiled list and the verdict; a head_dim no kernel takes is refused
// with the reason, in the text form too.
TEST(Cli, InfoReportsWhatRunsOnCuda) {
  REQUIRE_CLI();
  CliRun r = run("info --json --keys d4b8 --values d4b8 --head-dim 128");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const bool built = j["cuda"]["built"].get<bool>();
  EXPECT_EQ(j["config"]["keys"], "d4b8");
  EXPECT_EQ(j["config"]["mode"], "memory_bound");
  EXPECT_EQ(j["cuda_support"]["cache"].get<bool>(), built);
  EXPECT_EQ(j["cuda_support"]["attention"].get<bool>(), built);
  if (built) {
    EXPECT_EQ(j["cuda_support"]["kernel"], "d4b8/d4b8@128+i8");
    EXPECT_TRUE(j["cuda_support"]["tuned_kernel"].get<bool>());
    EXPECT_TRUE(j["cuda_support"]["prefill_kernel"].get<bool>());
    EXPECT_TRUE(j["cuda_support"]["prefill_over_rows"].get<bool>());  // memory-bound
    const auto& list = j["cuda"]["attention_configs"];
    EXPECT_NE(std::find(list.begin(), list.end(), "d4b12/d8b8@128+i8"), list.end()) << list.dump();
  } else {
    EXPECT_TRUE(j["cuda"]["attention_configs"].empty());
  }
  CliRun t = run("info --cache fp16 --head-dim 48");
  EXPECT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find(built ? "not supported: CUDA FP16 cache: head_dim 48" : "built without CUDA"), std::string::npos)
      << t.out;
  CliRun bad = run("info --keys d4x8");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("veloxquant: error: "), std::string::npos) << bad.out;
}

// `bench` on a small shape: a verify batch (--q-len 3) and whole decode steps (--step) time
// both caches and say so; a q_len past the context is refused naming both.
TEST(Cli, BenchTimesVerifyBatchesAndSteps) {
  REQUIRE_CLI();
  CliRun r = run("bench --json --ctx 600 --q-len 3 --heads 8 --kv-heads 1 --head-dim 64 --repeats 2 --threads 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["shape"]["q_len"], 3);
  EXPECT_EQ(j["shape"]["ctx"], 600);
  EXPECT_GT(j["fp16"]["median_ms"].get<double>(), 0.0);
  EXPECT_GT(j["vecinfer"]["median_ms"].get<double>(), 0.0);
  EXPECT_GT(j["bytes_ratio"].get<double>(), 1.0);
  EXPECT_EQ(j["step"], false);
  // --step: whole decode steps (update one token, then attend), said so in the JSON and the text
  CliRun st = run("bench --json --step --ctx 300 --heads 4 --kv-heads 2 --head-dim 64 --repeats 3 --threads 1");
  ASSERT_EQ(st.status, 0) << st.out;
  const nlohmann::json js = nlohmann::json::parse(st.out);
  EXPECT_EQ(js["step"], true);
  EXPECT_GT(js["vecinfer"]["median_ms"].get<double>(), 0.0);
  CliRun tx = run("bench --step --ctx 300 --heads 4 --kv-heads 2 --head-dim 64 --repeats 3 --threads 1");
  ASSERT_EQ(tx.status, 0) << tx.out;
  EXPECT_EQ(tx.out.rfind("decode step (update one token + attention)", 0), 0u) << tx.out;
  CliRun bad = run("bench --ctx 4 --q-len 5");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("veloxquant: error: bench: --q-len (5) must be between 1 and --ctx (4)"), std::string::npos)
      << bad.out;
}

// `bench --cold` flushes the last-level cache before every timed call (at least 64 MiB read, and
// said so), times both caches as usual, and is refused on cuda, where the GPU bench flushes L2.
TEST(Cli, BenchColdFlushesBeforeEveryCall) {
  REQUIRE_CLI();
  CliRun r = run("bench --json --cold --ctx 300 --heads 4 --kv-heads 2 --head-dim 64 --repeats 3 --threads 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cold"], true);
  EXPECT_GE(j["flush_bytes"].get<int64_t>(), int64_t(64) << 20);
  EXPECT_GT(j["fp16"]["median_ms"].get<double>(), 0.0);
  EXPECT_GT(j["vecinfer"]["median_ms"].get<double>(), 0.0);
  CliRun warm = run("bench --json --ctx 300 --heads 4 --kv-heads 2 --head-dim 64 --repeats 3 --threads 1");
  ASSERT_EQ(warm.status, 0) << warm.out;
  const nlohmann::json jw = nlohmann::json::parse(warm.out);
  EXPECT_EQ(jw["cold"], false);
  EXPECT_EQ(jw["flush_bytes"].get<int64_t>(), 0);
  CliRun tx = run("bench --cold --ctx 300 --heads 4 --kv-heads 2 --head-dim 64 --repeats 3 --threads 1");
  ASSERT_EQ(tx.status, 0) << tx.out;
  EXPECT_NE(tx.out.find(", cold ("), std::string::npos) << tx.out;
  CliRun gpu = run("bench --cold --device cuda --ctx 300");
  EXPECT_NE(gpu.status, 0);
  EXPECT_NE(gpu.out.find("--cold flushes the CPU's last-level cache"), std::string::npos) << gpu.out;
}

// `perplexity`, `generate` and `calibrate --model` on the committed test checkpoint, with
// progress bars; with `--device cuda`, perplexity and calibration run on a GPU where one is
// visible (the checkpoint's head_dim 16 has no device cache kernel, so attention goes to the
// host, said on stderr) and else fail with a message naming CUDA (no device, or no CUDA build).
TEST(Cli, PerplexityAndModelCalibrationOnEitherDevice) {
  REQUIRE_CLI();
  if (run("perplexity --help").status != 0) GTEST_SKIP() << "built without the runtime (VQ_BUILD_RUNTIME=OFF)";
  const std::string dir = tmp_dir(), text = dir + "/text.txt", model = std::string(VQ_TEST_DATA_DIR) + "/runtime/tiny-llama";
  {
    std::ofstream f(text);
    for (int i = 0; i < 40; ++i) f << "the cache holds the keys and values of token " << i << " in a long window. ";
  }
  const std::string ppl_args = "perplexity --model " + model + " --text " + text + " --ctx 32 --max-windows 3 --progress";
  auto ppl_of = [](const std::string& out, const std::string& name) {
    const size_t at = out.find(name + " ppl");
    return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + name.size() + 5);
  };
  const CliRun cpu = run(ppl_args);
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("on the cpu"), std::string::npos) << cpu.out;
  EXPECT_NE(cpu.out.find("93 tokens scored in 3 windows"), std::string::npos) << cpu.out;
  EXPECT_NE(cpu.out.find("3 windows, ppl "), std::string::npos) << cpu.out;  // the progress bar's last status
  const double cpu_ppl = ppl_of(cpu.out, "fp16     ");
  EXPECT_GT(cpu_ppl, 1.0) << cpu.out;
  // generate's prefill bar: a prompt of several chunks, --progress (stderr is not a terminal here)
  const CliRun gen = run("generate --model " + model + " --prompt-file " + text + " --prefill-chunk 64 -n 3 --progress");
  ASSERT_EQ(gen.status, 0) << gen.out;
  EXPECT_NE(gen.out.find("prefill ["), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find("100%"), std::string::npos) << gen.out;
  const CliRun quiet = run("generate --model " + model + " --prompt-file " + text + " --prefill-chunk 64 -n 3 -q --progress");
  ASSERT_EQ(quiet.status, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("prefill ["), std::string::npos) << quiet.out;
  const std::string cal_args = "calibrate --model " + model + " --text " + text +
                               " --ctx 32 --max-tokens 200 --keys d4b4 --values d4b4 --iters 2 --progress -o " + dir;
  const CliRun cal = run(cal_args + "/cpu.safetensors");
  ASSERT_EQ(cal.status, 0) << cal.out;
  EXPECT_NE(cal.out.find("200 tokens"), std::string::npos) << cal.out;
  EXPECT_EQ(Artifact::load(dir + "/cpu.safetensors").calib_tokens, 200);

  // --no-cuda-graphs is accepted everywhere (it only matters to decode calls on a GPU)
  const CliRun nog = run("generate --model " + model + " --prompt-file " + text + " -n 2 --no-cuda-graphs");
  ASSERT_EQ(nog.status, 0) << nog.out;
  const CliRun gpu = run(ppl_args + " --device cuda");
  const CliRun gcal = run(cal_args + "/gpu.safetensors --device cuda");
  // decode calls on the GPU say whether they replayed a CUDA graph: not with this checkpoint's
  // CPU caches (head_dim 16), and the reason is named
  const CliRun ggen = run("generate --model " + model + " --prompt-file " + text + " -n 3 --device cuda");
  if (cuda_is_available()) {
    ASSERT_EQ(ggen.status, 0) << ggen.out;
    EXPECT_NE(ggen.out.find("decode steps: launched from the host (the cache of layer 0 is on the CPU)"),
              std::string::npos)
        << ggen.out;
    ASSERT_EQ(gpu.status, 0) << gpu.out;
    EXPECT_NE(gpu.out.find("on cuda:0"), std::string::npos) << gpu.out;
    EXPECT_NE(gpu.out.find("attention runs on the host"), std::string::npos) << gpu.out;
    // bf16 weights: the device rounds activations to bf16 before each product, the CPU does not
    // (logits up to ~6% of a row's scale apart: tests/cuda's kMaxRelHalf); a broken pass on this
    // near-uniform random model lands farther (uniform logits: ppl = vocab 288 against ~480)
    EXPECT_NEAR(ppl_of(gpu.out, "fp16     "), cpu_ppl, 0.1 * cpu_ppl) << gpu.out;
    ASSERT_EQ(gcal.status, 0) << gcal.out;
    EXPECT_EQ(Artifact::load(dir + "/gpu.safetensors").calib_tokens, 200);
  } else {
    EXPECT_NE(gpu.status, 0);
    EXPECT_NE(gpu.out.find("CUDA"), std::string::npos) << gpu.out;
    EXPECT_NE(gcal.status, 0);
    EXPECT_NE(gcal.out.find("CUDA"), std::string::npos) << gcal.out;
    EXPECT_NE(ggen.status, 0);
    EXPECT_NE(ggen.out.find("CUDA"), std::string::npos) << ggen.out;
  }
}

TEST(Cli, CalibrateInspectRoundTrip) {
  REQUIRE_CLI();
  const std::string dir = tmp_dir();
  SyntheticKVConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.n_heads = 4;
  c.head_dim = 64;
  SyntheticKVModel m(c);
  const std::string kv = dir + "/kv.safetensors", art = dir + "/art.safetensors", js = dir + "/cal.json";
  m.generate(600, 0, 1).kv.save(kv);
  CliRun r = run("calibrate --kv " + kv + " --keys d4b6 --values d8b6 --iters 4 --seed 9 -o " + art + " --json " + js);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("key err (no transforms)"), std::string::npos) << r.out;
  const Artifact a = Artifact::load(art);
  EXPECT_EQ(a.n_layers, 2);
  EXPECT_EQ(a.key_spec.str(), "d4b6");
  EXPECT_EQ(a.value_spec.str(), "d8b6");
  EXPECT_EQ(a.calib_tokens, 600);
  FILE* jf = std::fopen(js.c_str(), "r");
  ASSERT_NE(jf, nullptr);
  nlohmann::json j = nlohmann::json::parse(jf);
  std::fclose(jf);
  EXPECT_EQ(j["layers"].size(), 2u);
  EXPECT_GT(j["layers"][0]["key_error_untransformed"].get<double>(), 0.0);

  CliRun i = run("inspect --json " + art);
  ASSERT_EQ(i.status, 0) << i.out;
  nlohmann::json ij = nlohmann::json::parse(i.out);
  EXPECT_EQ(ij["metadata"]["format"], "veloxquant-artifact");
  EXPECT_EQ(ij["layers"].size(), 2u);
  CliRun it = run("inspect " + art);
  EXPECT_EQ(it.status, 0);
  EXPECT_NE(it.out.find("d4b6"), std::string::npos) << it.out;
  CliRun ik = run("inspect " + kv);  // not an artifact: a plain listing
  EXPECT_EQ(ik.status, 0);
  EXPECT_NE(ik.out.find("layers.1.values"), std::string::npos) << ik.out;
}

TEST(Cli, DemoOnSmallShapesWritesJson) {
  REQUIRE_CLI();
  const std::string dir = tmp_dir();
  const std::string js = dir + "/demo.json";
  CliRun r = run("demo --layers 1 --kv-heads 2 --heads 4 --head-dim 128 --ctx 700 --calib-tokens 600 --queries 4 "
              "--iters 3 --repeats 1 --no-plot --json " + js);
  ASSERT_EQ(r.status, 0) << r.out;
  FILE* jf = std::fopen(js.c_str(), "r");
  ASSERT_NE(jf, nullptr);
  nlohmann::json j = nlohmann::json::parse(jf);
  std::fclose(jf);
  ASSERT_EQ(j["methods"].size(), 7u);
  EXPECT_EQ(j["methods"][0]["method"], "fp16");
  EXPECT_LT(j["methods"][0]["attention_output_error"].get<double>(), 0.01);
  for (const auto& m : j["methods"]) {
    EXPECT_GT(m["bytes"].get<int64_t>(), 0) << m;
    EXPECT_GT(m["bits_per_element_effective"].get<double>(), 0.0) << m;
  }
}
