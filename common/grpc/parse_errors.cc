#include "common/grpc/parse_errors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace recall::grpcutil {
namespace {

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status st = methods->GetSendStatus();
      if (st.error_code() == grpc::StatusCode::INTERNAL && st.error_message().empty()) {
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
};

class ParseErrorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info->method() != nullptr ? info->method() : "this method");
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseErrorInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<ParseErrorFactory>());
  return out;
}

}  // namespace recall::grpcutil
