// Metrics in the Prometheus text exposition format: counters, gauges (set, or read from a
// callback at scrape time) and histograms, registered once by name and label set and
// updated lock-free from any thread. Render() writes every family as Prometheus expects
// (# HELP, # TYPE, then the samples; histograms as cumulative _bucket{le=...}, _sum, _count).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace recall::metrics {

// A double that many threads add to without a lock.
class AtomicDouble {
 public:
  void Add(double d);
  void Set(double d) { bits_.store(ToBits(d), std::memory_order_relaxed); }
  double Get() const;

 private:
  static uint64_t ToBits(double d);
  std::atomic<uint64_t> bits_{0};
};

class Counter {
 public:
  void Increment(double by = 1) { value_.Add(by); }
  double value() const { return value_.Get(); }

 private:
  AtomicDouble value_;
};

class Gauge {
 public:
  void Set(double v) { value_.Set(v); }
  void Add(double by) { value_.Add(by); }
  double value() const { return value_.Get(); }

 private:
  AtomicDouble value_;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void Observe(double v);
  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Cumulative count of observations <= upper_bounds()[i]; the last entry is the total.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.Get(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [bounds + 1], not cumulative
  AtomicDouble sum_;
};

// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class Registry {
 public:
  // `labels` is the Prometheus label list without braces, e.g. `reason="stop"` (may be
  // empty). Registering the same name and labels twice returns the same metric. Returned
  // pointers live as long as the registry.
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const std::string& labels = "");
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const std::string& labels = "");
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> upper_bounds, const std::string& labels = "");
  // A gauge read from `read` at every Render (e.g. free KV blocks).
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> read, const std::string& labels = "");
  // Removes every callback gauge series with exactly these labels (a family left with none is
  // not rendered); not allowed from inside a callback.
  void RemoveCallbackGauges(const std::string& labels);

  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    std::string labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  struct Family {
    std::string help;
    Type type;
    std::vector<std::unique_ptr<Series>> series;
  };
  Series* FindOrAdd(const std::string& name, const std::string& help, Type type,
                    const std::string& labels, bool* created) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::metrics
