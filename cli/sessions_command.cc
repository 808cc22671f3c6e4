#include "cli/sessions_command.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/connection.h"
#include "common/status.h"
#include "common/utf8.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace recall::cli {
namespace {

constexpr char kSessionsUsageHead[] =
    R"(usage: recall sessions list|ls|show ID [--json]|delete ID --server HOST:PORT [options]

)";

// A session as JSON, its messages' text as text (protobuf's JSON prints bytes as base64).
absl::StatusOr<std::string> SessionJson(const v1::Session& s) {
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(s, &out).ok()) {
    return absl::InternalError("cannot print the session as JSON");
  }
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded()) return absl::InternalError("cannot print the session as JSON");
  for (int i = 0; i < s.messages_size() && j.contains("messages"); ++i) {
    j["messages"][i]["content"] = s.messages(i).content();
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

absl::Status Sessions(const ConnectOptions& c, const std::vector<std::string>& pos, bool json) {
  const std::string verb = pos.empty() ? "list" : pos[0] == "ls" ? "list" : pos[0];
  const size_t args = pos.empty() ? 0 : pos.size() - 1;
  if (verb == "list" && (args != 0 || json)) {
    return absl::InvalidArgumentError("list: takes no session id and no --json");
  }
  if ((verb == "show" || verb == "delete") && args != 1) {
    return absl::InvalidArgumentError(absl::StrCat(verb, ": needs one session id, got ", args));
  }
  if (verb == "delete" && json) return absl::InvalidArgumentError("delete: takes no --json");
  if (args == 1 && !utf8::IsValid(pos[1])) {
    return absl::InvalidArgumentError(absl::StrCat(verb, ": the session id is not UTF-8"));
  }
  if (verb != "list" && verb != "show" && verb != "delete") {
    return absl::InvalidArgumentError(absl::StrCat("unknown sessions command \"", verb,
                                                   "\" (list, show ID [--json], delete ID)"));
  }
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(c));
  if (verb == "list") {
    std::string token;
    int listed = 0;
    do {
      RECALL_ASSIGN_OR_RETURN(v1::ListSessionsResponse page, client->ListSessions(100, token));
      for (const v1::Session& s : page.sessions()) {
        std::cout << s.session_id() << "  " << s.model() << "  turns=" << s.turns() << "\n";
        ++listed;
      }
      token = page.next_page_token();
    } while (!token.empty());
    // Said on stderr, so that a script reading the list gets an empty one.
    if (listed == 0) std::cerr << "no sessions (of this tenant)\n";
    return absl::OkStatus();
  }
  if (verb == "show") {
    RECALL_ASSIGN_OR_RETURN(v1::Session s, client->GetSession(pos[1]));
    if (json) {
      RECALL_ASSIGN_OR_RETURN(const std::string out, SessionJson(s));
      std::cout << out;
      return absl::OkStatus();
    }
    // Exchanges, as `list` counts them; GetSession's turns are those whose reply completed.
    const int exchanges = static_cast<int>(
        std::count_if(s.messages().begin(), s.messages().end(),
                      [](const v1::ChatMessage& m) { return m.role() == "assistant"; }));
    std::cout << "session " << s.session_id() << "  model " << s.model() << "  turns " << exchanges
              << (exchanges != s.turns() ? absl::StrCat(" (", s.turns(), " complete)") : "")
              << "\n";
    for (const v1::ChatMessage& m : s.messages()) {
      std::cout << "\n" << m.role() << StateNote(m) << ":\n" << Printable(m.content()) << "\n";
    }
    return absl::OkStatus();
  }
  return client->DeleteSession(pos[1]);
}

}  // namespace

int RunSessions(const std::vector<std::string>& argv) {
  // The verb, the session id and the flags in any order (--json anywhere): every connection
  // flag takes a value, the next word unless it has "=VALUE" (`show --server X ID` was
  // refused).
  std::vector<std::string> pos, rest;
  bool json = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kSessionsUsageHead << ConnectFlags().Help();
      return 0;
    }
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a.rfind("-", 0) != 0) {
      pos.push_back(a);
      continue;
    }
    rest.push_back(a);
    if (a.find('=') == std::string::npos && i + 1 < argv.size()) rest.push_back(argv[++i]);
  }
  ConnectOptions options;
  if (absl::Status st = ConnectFlags().Parse(rest, &options); !st.ok()) {
    return Report("sessions", st, kSessionsUsageHead);
  }
  return Report("sessions", Sessions(options, pos, json), kSessionsUsageHead);
}

}  // namespace recall::cli
