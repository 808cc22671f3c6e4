#include "common/grpc/status_interceptor.h"

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"

namespace recall::grpcutil {
namespace {

class StatusInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatusInterceptor(std::string method, bool exists)
      : method_(std::move(method)), exists_(exists) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status st = methods->GetSendStatus();
      // The synchronous API says INTERNAL; the callback API (Converse, Generate, RunTurn, the
      // worker's unary calls) UNIMPLEMENTED, as if the method did not exist.
      const bool parse_failed = st.error_message().empty() &&
                                (st.error_code() == grpc::StatusCode::INTERNAL ||
                                 (exists_ && st.error_code() == grpc::StatusCode::UNIMPLEMENTED));
      if (parse_failed) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request: cannot be parsed as the request message of ", method_,
                         " (malformed protobuf, or a string field that is not valid UTF-8)")));
      } else if (st.error_message().size() > kMaxStatusMessageBytes) {
        methods->ModifySendStatus(grpc::Status(
            st.error_code(), CutStatusMessage(st.error_message()), st.error_details()));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const bool exists_;
};

class StatusInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit StatusInterceptorFactory(std::set<std::string> methods) : methods_(std::move(methods)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string method = info->method() != nullptr ? info->method() : "";
    return new StatusInterceptor(method.empty() ? "this method" : method,
                                 methods_.count(method) > 0);
  }

 private:
  const std::set<std::string> methods_;  // "/package.Service/Method"
};

}  // namespace

std::string CutStatusMessage(const std::string& message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  const std::string tail = absl::StrCat("... (cut: the message is ", message.size(), " bytes)");
  size_t keep = kMaxStatusMessageBytes - tail.size();
  // Not inside a character: back over its continuation bytes to its first.
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  return message.substr(0, keep) + tail;
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
StatusInterceptors(const std::vector<std::string>& services) {
  std::set<std::string> methods;
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      methods.insert("/" + name + "/" + service->method(i)->name());
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<StatusInterceptorFactory>(std::move(methods)));
  return out;
}

}  // namespace recall::grpcutil
