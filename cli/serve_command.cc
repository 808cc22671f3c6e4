#include "cli/serve_command.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/grpc/cluster_credential.h"
#include "common/grpc/quiet_handshakes.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "common/subprocess.h"
#include "coordinator/server.h"
#include "worker/service/worker_options.h"

namespace recall::cli {
namespace {

constexpr char kUsageHead[] = R"(usage: recall serve --model PATH [--tokenizer PATH] [options]

Starts one recall-worker (a child process) and a coordinator in front of it, with the
session store in DATA_DIR/sessions.db. Chat with it: recall chat --server HOST:PORT, or any
OpenAI client at http://HOST:HTTP_PORT/v1 (--http-listen). Prometheus metrics on
http://127.0.0.1:METRICS_PORT/metrics. If the worker dies it is restarted (up to 3 times in
a minute); after that recall serve exits, saying why. One log line per turn on stderr
(RECALL_LOG_LEVEL=WARNING silences them).

)";

struct ServeOptions {
  std::string listen = "127.0.0.1:50050";  // the coordinator
  std::string http_listen = "127.0.0.1:8080";  // its OpenAI-compatible HTTP API; "off": none
  std::string data_dir;                        // empty: DefaultDataDir()
  int metrics_port = 0;                        // the coordinator's /metrics: 0 a free port, -1 off
  std::string api_keys;   // "<key> <tenant>" lines; empty: no auth
  std::string port_file;  // "grpc=PORT http=PORT" once ready
  bool allow_store_loss = false;           // CoordinatorConfig::allow_store_loss
  coordinator::CoordinatorOptions limits;  // the coordinator's limits (the --max-* flags)
  service::WorkerOptions worker;
  ServeOptions() {
    worker.listen = "127.0.0.1:0";
    worker.engine.kv_cache_bytes = int64_t{256} << 20;
  }
};

// serve's own flags, then every worker flag but those serve sets itself.
const flags::FlagSet<ServeOptions>& ServeFlags() {
  static const flags::FlagSet<ServeOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<ServeOptions>();
    f->Section("serve")
        .String(
            "listen", "HOST:PORT", "the coordinator (default 127.0.0.1:50050)",
            [](auto& o) -> auto& { return o.listen; })
        .String(
            "http-listen", "HOST:PORT",
            "the OpenAI-compatible HTTP API (default 127.0.0.1:8080; port 0 picks one;\n"
            "off: none)",
            [](auto& o) -> auto& { return o.http_listen; })
        .String(
            "data-dir", "DIR",
            "session store folder (default $XDG_DATA_HOME/recall, else\n"
            "~/.local/share/recall; ./recall-data without HOME)",
            [](auto& o) -> auto& { return o.data_dir; })
        .Int(
            "metrics-port", "N",
            "the coordinator's Prometheus /metrics on 127.0.0.1 (default 0: a free port,\n"
            "printed; -1: off)",
            [](auto& o) -> auto& { return o.metrics_port; }, -1, 65535)
        .Int(
            "worker-metrics-port", "N",
            "the worker's Prometheus /metrics on 127.0.0.1 (KV blocks, evictions, resident\n"
            "sessions; default: off; 0: a free port, printed)",
            [](auto& o) -> auto& { return o.worker.metrics_port; }, 0, 65535)
        .String(
            "api-keys", "FILE", "\"<key> <tenant>\" lines; default: no auth (local use)",
            [](auto& o) -> auto& { return o.api_keys; })
        .String(
            "port-file", "PATH",
            "write \"grpc=PORT http=PORT\" once ready (http=0: off; then\n"
            "\" worker-metrics=PORT\" with --worker-metrics-port)",
            [](auto& o) -> auto& { return o.port_file; })
        .Switch(
            "allow-store-loss",
            "start on a session store that lost sessions (a damaged or emptied sessions.db),\n"
            "serving what can be read, with a warning; by default serve refuses to start",
            [](auto& o) -> auto& { return o.allow_store_loss; })
        .Include(
            coordinator::LimitFlags(), [](auto& o) -> auto& { return o.limits; })
        .Include(service::WorkerFlags(), [](auto& o) -> auto& { return o.worker; },
                 {"listen", "port-file", "coordinator", "advertise", "metrics-port"})
        .Help("kv-cache-bytes",
              "KV pool size over all ranks, e.g. 512M or 2GiB (default 256M here; with\n"
              "--kv-cache-fraction, that fraction instead); it holds the sessions' KV blocks,\n"
              "their eviction policies' state and the running turns' attention scratch")
        .Short('m', "model")
        .Short('t', "threads");
    return f;
  }();
  return *kFlags;
}

// recall-worker beside this binary (installed) or in the build tree.
std::string WorkerBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (const std::filesystem::path& p :
       {self.parent_path() / "recall-worker",
        self.parent_path().parent_path() / "worker/service/recall-worker"}) {
    if (std::filesystem::exists(p, ec)) return p.string();
  }
  return "";
}

// Where sessions live when --data-dir is not given: the same folder whatever the current
// directory (the XDG base directory convention).
std::string DefaultDataDir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/recall";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.local/share/recall";
  }
  return "./recall-data";
}

// How a child ended, for a message.
absl::Status Serve(const ServeOptions& o) {
  if (o.worker.model.model.empty()) return absl::InvalidArgumentError("--model: required");
  const std::string worker_bin = WorkerBinary();
  if (worker_bin.empty()) {
    return absl::NotFoundError("cannot find recall-worker beside this binary");
  }
  const std::string data_dir = o.data_dir.empty() ? DefaultDataDir() : o.data_dir;
  std::error_code ec;
  // Made the owner's only, as recall-coordinator makes its --data-dir: it holds the session
  // store (every session's transcript) and the cluster token.
  if (std::filesystem::create_directories(data_dir, ec) && !ec) {
    std::filesystem::permissions(data_dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data-dir: cannot create ", data_dir, ": ", ec.message()));
  }
  // The worker's port takes calls only from this coordinator: a cluster token made once in
  // the data directory (mode 0600), unless --cluster-token-file names one.
  service::WorkerOptions worker_options = o.worker;
  if (absl::Status st = service::CheckServedModelName(worker_options.served_model_name); !st.ok()) {
    return ServeFlags().Explain(st);
  }
  if (worker_options.cluster_token_file.empty()) {
    worker_options.cluster_token_file = data_dir + "/cluster-token";
    RECALL_RETURN_IF_ERROR(grpcutil::EnsureTokenFile(worker_options.cluster_token_file).status());
  }
  // The worker gets every worker flag given to serve (and serve's defaults for it).
  const std::vector<std::string> worker_args = service::WorkerFlags().Render(worker_options);

  // Before any thread starts (the coordinator's inherit the mask): Ctrl-C and SIGTERM are
  // waited for below, whichever thread takes them (common/stop_signals.h).
  StopSignals stop;
  grpcutil::QuietHandshakeLogs();

  // The coordinator first: its flags, its store (a data directory another serve holds) and
  // its ports are refused before the worker spends minutes loading the model. It knows the
  // worker once the worker listens; until then a turn is refused as retryable.
  coordinator::CoordinatorConfig c;
  c.listen = o.listen;
  c.data_dir = data_dir;
  c.api_keys_path = o.api_keys;
  c.allow_store_loss = o.allow_store_loss;
  c.cluster_token_file = worker_options.cluster_token_file;
  c.metrics_port = o.metrics_port;
  c.options = o.limits;
  if (o.http_listen != "off") c.http_listen = o.http_listen;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> started =
      coordinator::CoordinatorServer::Start(c);
  if (!started.ok()) return ServeFlags().Explain(started.status());
  std::unique_ptr<coordinator::CoordinatorServer> server = std::move(*started);

  ServerProcess worker;
  worker.set_die_with_parent(true);  // a serve killed hard leaves no worker holding its pool
  std::string error;
  // Ctrl-C or SIGTERM while the worker loads its model (minutes, for a large one) stop both
  // at once, rather than once the model has loaded.
  bool stopped = false;
  const auto interrupted = [&] {
    stopped = stopped || stop.Wait(absl::ZeroDuration()) != 0;
    return stopped;
  };
  // A Start that failed because Ctrl-C (sent to the whole process group) ended the worker
  // first: stopped too.
  const auto ended_by_signal = [&] {
    const std::optional<int> exit = worker.early_exit();
    return interrupted() || (exit.has_value() && WIFSIGNALED(*exit) &&
                             (WTERMSIG(*exit) == SIGINT || WTERMSIG(*exit) == SIGTERM));
  };
  if (!worker.Start(worker_bin, worker_args, data_dir, &error, std::chrono::seconds(300),
                    interrupted)) {
    server->Shutdown();
    if (ended_by_signal()) {
      std::cerr << "recall serve: stopped while the worker was loading its model\n";
      return absl::OkStatus();
    }
    const std::optional<int> exit = worker.early_exit();
    if (exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 2) {
      // It refused a flag (its message is above): a usage error of serve's, exit status 2.
      return absl::InvalidArgumentError("the worker refused its flags or a file they name (above)");
    }
    return absl::UnavailableError(absl::StrCat("the worker did not start: ", error));
  }
  server->workers().Add(absl::StrCat("127.0.0.1:", worker.port("grpc")));
  std::cerr << "recall serve: ready on " << c.listen << " (port " << server->port()
            << "); worker on port " << worker.port("grpc") << "; sessions in " << data_dir
            << "/sessions.db\n";
  if (server->http_port() > 0) {
    std::cerr << "recall serve: OpenAI-compatible HTTP API on http://"
              << c.http_listen.substr(0, c.http_listen.rfind(':')) << ":" << server->http_port()
              << "/v1\n";
  }
  if (server->metrics_port() > 0) {
    std::cerr << "recall serve: metrics on http://127.0.0.1:" << server->metrics_port()
              << "/metrics\n";
  }
  if (worker.port("metrics") > 0) {
    std::cerr << "recall serve: the worker's metrics on http://127.0.0.1:" << worker.port("metrics")
              << "/metrics\n";
    worker_options.metrics_port = worker.port("metrics");  // the same port after a restart
  }
  if (!o.port_file.empty()) {
    const absl::Status written = WritePortFile(
        o.port_file, absl::StrCat("grpc=", server->port(), " http=", server->http_port(),
                                  worker.port("metrics") > 0
                                      ? absl::StrCat(" worker-metrics=", worker.port("metrics"))
                                      : "",
                                  "\n"));
    if (!written.ok()) {
      server->Shutdown();
      worker.Stop();
      return written;
    }
  }
  // Until SIGINT or SIGTERM; a worker that dies is restarted on its port (the coordinator
  // knows it there), at most kRestarts times within a minute.
  constexpr int kRestarts = 3;
  const int worker_port = worker.port("grpc");
  std::vector<std::chrono::steady_clock::time_point> restarts;
  absl::Status ended = absl::OkStatus();
  while (true) {
    if (stop.Wait(absl::Milliseconds(100)) != 0) break;
    const std::optional<int> status = worker.Reap();
    if (!status.has_value()) continue;
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(restarts, [&](auto t) { return now - t > std::chrono::minutes(1); });
    std::cerr << "recall serve: the worker " << ExitReason(*status);
    if (static_cast<int>(restarts.size()) >= kRestarts) {
      std::cerr << "\n";
      ended = absl::UnavailableError(
          absl::StrCat("the worker ", ExitReason(*status), ", its ", kRestarts + 1,
                       "th end within a minute; not restarting it (its log is above)"));
      break;
    }
    std::cerr << "; restarting it\n";
    restarts.push_back(now);
    service::WorkerOptions again = worker_options;
    again.listen = absl::StrCat("127.0.0.1:", worker_port);
    if (!worker.Start(worker_bin, service::WorkerFlags().Render(again), data_dir, &error,
                      std::chrono::seconds(300), interrupted)) {
      if (!ended_by_signal()) {
        ended = absl::UnavailableError(absl::StrCat("the worker did not restart: ", error));
      }
      break;
    }
    std::cerr << "recall serve: worker back on port " << worker_port << "\n";
  }
  std::cerr << "recall serve: shutting down\n";
  if (ended.ok()) {
    // Running turns end first (the worker, sent the same Ctrl-C, lets them end too).
    const int left = server->Drain(absl::Seconds(worker_options.shutdown_grace_seconds), [&] {
      return stop.Wait(absl::Milliseconds(100)) != 0;  // a second signal
    });
    if (left > 0) std::cerr << "recall serve: ending " << left << " running turn(s)\n";
  }
  stop.Ignore();
  server->Shutdown();
  worker.Stop();
  if (!o.port_file.empty()) std::filesystem::remove(o.port_file, ec);  // its ports are closed
  return ended;
}

}  // namespace

int RunServe(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << ServeFlags().Help();
      return 0;
    }
  }
  ServeOptions options;
  std::set<std::string> given;
  if (absl::Status st = ServeFlags().Parse(argv, &options, &given); !st.ok()) {
    std::cerr << "recall serve: " << st.message() << " (recall serve --help lists the flags)\n";
    return 2;
  }
  // serve's default pool is 256M; a fraction given instead takes its place (the worker takes
  // a size over a fraction).
  if (given.count("kv-cache-fraction") > 0 && given.count("kv-cache-bytes") == 0) {
    options.worker.engine.kv_cache_bytes.reset();
  }
  if (absl::Status st = Serve(options); !st.ok()) {
    std::cerr << "recall serve: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
