#include "coordinator/lease_keeper.h"

namespace recall::coordinator {

LeaseKeeper::LeaseKeeper(absl::Duration period) : period_(period) {
  thread_ = std::thread([this] { Loop(); });
}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void LeaseKeeper::Add(Renewable* r) {
  absl::MutexLock lock(&mu_);
  renewables_.insert(r);
}

void LeaseKeeper::Remove(Renewable* r) {
  absl::MutexLock lock(&mu_);  // the loop calls them holding it
  renewables_.erase(r);
}

void LeaseKeeper::Loop() {
  const int64_t idle_ms = absl::ToInt64Milliseconds(period_);
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
    if (stop_) return;
    for (Renewable* r : renewables_) r->RenewIfSilent(idle_ms);
  }
}

}  // namespace recall::coordinator
