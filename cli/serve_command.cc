#include "cli/serve_command.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "coordinator/server.h"

namespace recall::cli {
namespace {

constexpr char kUsage[] = R"(usage: recall serve --model PATH [--tokenizer PATH] [options]

Starts one recall-worker (a child process) and a coordinator in front of it, with the
session store in DATA_DIR/sessions.db. Chat with it: recall chat --server HOST:PORT.

  --model PATH            llama2.c checkpoint or Hugging Face folder
  --tokenizer PATH        tokenizer (llama2.c checkpoints)
  --listen HOST:PORT      the coordinator (default 127.0.0.1:50050)
  --data-dir DIR          session store folder (default ./recall-data)
  --api-keys FILE         "<key> <tenant>" lines; default: no auth (local use)
  --port-file PATH        write "grpc=PORT" once ready
  --kv-cache-bytes SIZE, --policy NAME, --budget N, --budget-frac F, --window W,
  --threads N, --chat-format NAME, --device NAME, --tp N, --devices LIST,
  --tp-comm KIND, --tp-eviction MODE,
  --episodes N, --embedder NAME, --block-tokens N, --recluster-turns N,
  --layer-budgets SPEC, --layer-alpha A:
                          passed to the worker (recall-worker --help)
)";

// recall-worker beside this binary (installed) or in the build tree.
std::string WorkerBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (const std::filesystem::path& p :
       {self.parent_path() / "recall-worker",
        self.parent_path().parent_path() / "worker/service/recall-worker"}) {
    if (std::filesystem::exists(p)) return p.string();
  }
  return "";
}

absl::Status Serve(const Args& args) {
  if (!args.Has("model")) return absl::InvalidArgumentError("--model: required");
  const std::string worker_bin = WorkerBinary();
  if (worker_bin.empty()) {
    return absl::NotFoundError("cannot find recall-worker beside this binary");
  }
  std::vector<std::string> worker_args = {"--listen", "127.0.0.1:0"};
  for (const char* flag :
       {"model",       "tokenizer",    "kv-cache-bytes",  "policy",        "budget",
        "budget-frac", "window",       "threads",         "chat-format",   "device",
        "tp",          "devices",      "tp-comm",         "tp-eviction",   "episodes",
        "embedder",    "block-tokens", "recluster-turns", "layer-budgets", "layer-alpha"}) {
    if (args.Has(flag)) {
      worker_args.push_back(absl::StrCat("--", flag));
      worker_args.push_back(args.GetString(flag));
    }
  }
  if (!args.Has("kv-cache-bytes")) {
    worker_args.push_back("--kv-cache-bytes");
    worker_args.push_back("256M");
  }
  const std::string data_dir = args.GetString("data-dir", "./recall-data");
  std::filesystem::create_directories(data_dir);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ServerProcess worker;
  std::string error;
  if (!worker.Start(worker_bin, worker_args, data_dir, &error, std::chrono::seconds(300))) {
    return absl::UnavailableError(absl::StrCat("the worker did not start: ", error));
  }
  coordinator::CoordinatorConfig c;
  c.listen = args.GetString("listen", c.listen);
  c.workers = {absl::StrCat("127.0.0.1:", worker.port("grpc"))};
  c.data_dir = data_dir;
  c.api_keys_path = args.GetString("api-keys");
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<coordinator::CoordinatorServer> server,
                          coordinator::CoordinatorServer::Start(c));
  std::cerr << "recall serve: ready on " << c.listen << " (port " << server->port()
            << "); worker on port " << worker.port("grpc") << "; sessions in " << data_dir
            << "/sessions.db\n";
  if (args.Has("port-file")) {
    const std::string path = args.GetString("port-file");
    {
      std::ofstream out(path + ".tmp");
      out << "grpc=" << server->port() << "\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "recall serve: shutting down\n";
  server->Shutdown();
  worker.Stop();
  return absl::OkStatus();
}

}  // namespace

int RunServe(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(
      argv, {"model",        "tokenizer",       "listen",        "data-dir",   "api-keys",
             "port-file",    "kv-cache-bytes",  "policy",        "budget",     "budget-frac",
             "window",       "threads",         "chat-format",   "device",     "tp",
             "devices",      "tp-comm",         "tp-eviction",   "episodes",   "embedder",
             "block-tokens", "recluster-turns", "layer-budgets", "layer-alpha"},
      {"help"});
  if (!args.ok()) {
    std::cerr << "recall serve: " << args.status().message() << "\n\n" << kUsage;
    return 2;
  }
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  const absl::Status st = Serve(*args);
  if (!st.ok()) {
    std::cerr << "recall serve: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
