// A fixed-bucket histogram the engine thread fills (step times, decode inter-token latency,
// prefill tokens per step) and stats() copies out as a pe_histogram.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "core/error.h"
#include "pyengine.h"

namespace pe {

class Histogram {
 public:
  // Ascending upper bounds, at most PE_HISTOGRAM_BOUNDS.
  Histogram(std::initializer_list<double> upper_bounds) {
    if (upper_bounds.size() > PE_HISTOGRAM_BOUNDS) fail(PE_ERR_INTERNAL, "histogram: too many bounds");
    h_.n_bounds = static_cast<int32_t>(upper_bounds.size());
    std::copy(upper_bounds.begin(), upper_bounds.end(), h_.upper_bounds);
  }

  void observe(double value) {
    const double* begin = h_.upper_bounds;
    ++h_.counts[std::lower_bound(begin, begin + h_.n_bounds, value) - begin];  // the first bound >= value
    ++h_.count;
    h_.sum += value;
  }

  const pe_histogram& get() const { return h_; }

 private:
  pe_histogram h_{};
};

}  // namespace pe
