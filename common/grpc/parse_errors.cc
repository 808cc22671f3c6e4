#include "common/grpc/parse_errors.h"

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"

namespace recall::grpcutil {
namespace {

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  ParseErrorInterceptor(std::string method, bool exists)
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
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const bool exists_;
};

class ParseErrorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ParseErrorFactory(std::set<std::string> methods) : methods_(std::move(methods)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string method = info->method() != nullptr ? info->method() : "";
    return new ParseErrorInterceptor(method.empty() ? "this method" : method,
                                     methods_.count(method) > 0);
  }

 private:
  const std::set<std::string> methods_;  // "/package.Service/Method"
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseErrorInterceptors(const std::vector<std::string>& services) {
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
  out.push_back(std::make_unique<ParseErrorFactory>(std::move(methods)));
  return out;
}

}  // namespace recall::grpcutil
