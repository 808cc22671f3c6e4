// A multi-turn chat backend on the SDK, in a few lines: reads user messages from stdin (one
// per line), streams each reply to stdout, keeps the conversation in one session.
//
//   ./build/client/recall_chat_example 127.0.0.1:50050 [api-key] < questions.txt
//
// client/client.h quotes its core lines; tests/packaging builds this file against an installed
// SDK (find_package(Recall) and pkg-config, docs/usage.md) and runs it with no server.
#include <iostream>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  recall::ClientOptions options;
  if (argc > 1) options.address = argv[1];
  if (argc > 2) options.api_key = argv[2];
  auto client = recall::Client::Connect(options);

  recall::v1::CreateSessionRequest create;
  create.set_system_prompt("You are a helpful assistant.");
  auto session = client->StartSession(create);
  if (!session.ok()) {
    std::cerr << "cannot start a session: " << session.status() << "\n";
    return 1;
  }
  (*session)->sampling().set_temperature(0.7f);
  (*session)->sampling().set_max_tokens(200);

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << "user: " << line << "\nassistant:";
    auto done =
        (*session)->Send(line, [](const std::string& text) { std::cout << text << std::flush; });
    std::cout << "\n";
    if (!done.ok()) {
      std::cerr << "turn failed: " << done.status() << "\n";
      return 1;
    }
    std::cerr << "[" << done->usage().generated_tokens() << " tokens, "
              << done->usage().cached_tokens() << " prompt tokens reused, worker " << done->worker()
              << "]\n";
  }
  auto history = (*session)->History();
  if (history.ok()) std::cerr << "[" << history->size() << " messages stored]\n";
  return 0;
}
