#include "common/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace recall::metrics {

uint64_t AtomicDouble::ToBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

double AtomicDouble::Get() const {
  const uint64_t bits = bits_.load(std::memory_order_relaxed);
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

void AtomicDouble::Add(double delta) {
  uint64_t old_bits = bits_.load(std::memory_order_relaxed);
  while (true) {
    double old;
    std::memcpy(&old, &old_bits, sizeof(old));
    if (bits_.compare_exchange_weak(old_bits, ToBits(old + delta), std::memory_order_relaxed)) {
      return;
    }
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  RECALL_CHECK(std::is_sorted(bounds_.begin(), bounds_.end())) << "bucket bounds must ascend";
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.Add(v);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

Registry::Series* Registry::FindOrAdd(const std::string& name, const std::string& help,
                                      Type type, const std::string& labels, bool* created) {
  auto [it, inserted] = families_.try_emplace(name);
  Family& f = it->second;
  if (inserted) {
    f.help = help;
    f.type = type;
  }
  RECALL_CHECK(f.type == type) << "metric " << name << " registered with two types";
  for (auto& s : f.series) {
    if (s->labels == labels) {
      *created = false;
      return s.get();
    }
  }
  f.series.push_back(std::make_unique<Series>());
  f.series.back()->labels = labels;
  *created = true;
  return f.series.back().get();
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help,
                              const std::string& labels) {
  absl::MutexLock lock(&mu_);
  bool created;
  Series* s = FindOrAdd(name, help, Type::kCounter, labels, &created);
  if (created) s->counter = std::make_unique<Counter>();
  return s->counter.get();
}

Gauge* Registry::GetGauge(const std::string& name, const std::string& help,
                          const std::string& labels) {
  absl::MutexLock lock(&mu_);
  bool created;
  Series* s = FindOrAdd(name, help, Type::kGauge, labels, &created);
  if (created) s->gauge = std::make_unique<Gauge>();
  RECALL_CHECK(s->gauge != nullptr) << "gauge " << name << " is a callback gauge";
  return s->gauge.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> upper_bounds, const std::string& labels) {
  absl::MutexLock lock(&mu_);
  bool created;
  Series* s = FindOrAdd(name, help, Type::kHistogram, labels, &created);
  if (created) s->histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  return s->histogram.get();
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                std::function<double()> read, const std::string& labels) {
  absl::MutexLock lock(&mu_);
  bool created;
  Series* s = FindOrAdd(name, help, Type::kGauge, labels, &created);
  s->read = std::move(read);
}

void Registry::RemoveCallbackGauges(const std::string& labels) {
  absl::MutexLock lock(&mu_);
  for (auto it = families_.begin(); it != families_.end();) {
    std::erase_if(it->second.series, [&](const std::unique_ptr<Series>& s) {
      return s->read != nullptr && s->gauge == nullptr && s->labels == labels;  // none handed out
    });
    it = it->second.series.empty() ? families_.erase(it) : std::next(it);
  }
}

namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

std::string Braced(const std::string& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  if (labels.empty()) return absl::StrCat("{", extra, "}");
  if (extra.empty()) return absl::StrCat("{", labels, "}");
  return absl::StrCat("{", labels, ",", extra, "}");
}

}  // namespace

std::string Registry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", type, "\n");
    for (const auto& s : f.series) {
      if (s->histogram != nullptr) {
        const std::vector<uint64_t> counts = s->histogram->CumulativeCounts();
        const std::vector<double>& bounds = s->histogram->upper_bounds();
        for (size_t i = 0; i < bounds.size(); ++i) {
          absl::StrAppend(&out, name, "_bucket",
                          Braced(s->labels, absl::StrCat("le=\"", FormatValue(bounds[i]), "\"")),
                          " ", counts[i], "\n");
        }
        absl::StrAppend(&out, name, "_bucket", Braced(s->labels, "le=\"+Inf\""), " ",
                        counts.back(), "\n");
        absl::StrAppend(&out, name, "_sum", Braced(s->labels), " ",
                        FormatValue(s->histogram->sum()), "\n");
        absl::StrAppend(&out, name, "_count", Braced(s->labels), " ", counts.back(), "\n");
        continue;
      }
      const double v = s->read ? s->read()
                       : s->counter != nullptr ? s->counter->value()
                                               : s->gauge->value();
      absl::StrAppend(&out, name, Braced(s->labels), " ", FormatValue(v), "\n");
    }
  }
  return out;
}

}  // namespace recall::metrics
