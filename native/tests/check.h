// A tiny test framework for the C-level tests: one executable per test_*.cpp, each including
// this header once. TEST(name) { ... } registers a test; CHECK* record a failure (with file:line)
// and let the test continue; main() runs every test (or those whose name contains argv[1]) and
// returns the number of failed tests (0 = success), so ctest sees a nonzero exit on failure.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace pe_test {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

inline int& current_failures() {
  static int n = 0;
  return n;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

inline void fail(const char* file, int line, const std::string& msg) {
  ++current_failures();
  if (current_failures() <= 20) std::printf("  FAIL %s:%d: %s\n", file, line, msg.c_str());
}

// Normalized error ||a - ref|| / ||ref|| (absolute when ref is all zero) and max |a - ref|.
struct Error {
  double rel = 0.0, max_abs = 0.0;
};

template <typename A, typename B>
Error compare(const A* a, const B* ref, int64_t n) {
  double num = 0.0, den = 0.0, mx = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(ref[i]);
    if (std::isnan(d)) return {INFINITY, INFINITY};
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
    mx = std::max(mx, std::fabs(d));
  }
  Error e;
  e.rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  e.max_abs = mx;
  return e;
}

// Seeded xorshift-style generator (splitmix64 steps) for reproducible inputs.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(uniform()); }
  float normal() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  std::vector<float> normals(int64_t n, float scale = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal() * scale;
    return v;
  }
  std::vector<float> uniforms(int64_t n, float lo, float hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
};

}  // namespace pe_test

#define TEST(name)                                                    \
  static void name();                                                 \
  static pe_test::Registrar name##_registrar(#name, name);            \
  static void name()

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) pe_test::fail(__FILE__, __LINE__, "CHECK(" #cond ")");    \
  } while (0)

#define CHECK_EQ(a, b)                                                                       \
  do {                                                                                       \
    const auto va_ = (a);                                                                    \
    const auto vb_ = (b);                                                                    \
    if (!(va_ == vb_))                                                                       \
      pe_test::fail(__FILE__, __LINE__,                                                      \
                    std::string(#a " == " #b ": ") + std::to_string(va_) + " vs " +          \
                        std::to_string(vb_));                                                \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                                \
  do {                                                                                       \
    const double va_ = (a), vb_ = (b);                                                       \
    if (!(std::fabs(va_ - vb_) <= (tol)))                                                    \
      pe_test::fail(__FILE__, __LINE__,                                                      \
                    std::string(#a " ~ " #b ": ") + std::to_string(va_) + " vs " +           \
                        std::to_string(vb_));                                                \
  } while (0)

// Arrays: normalized error ||a - ref|| / ||ref|| must be <= rel_tol.
#define CHECK_CLOSE(a, ref, n, rel_tol)                                                       \
  do {                                                                                        \
    const pe_test::Error e_ = pe_test::compare((a), (ref), (n));                              \
    if (!(e_.rel <= (rel_tol))) {                                                             \
      char buf_[256];                                                                         \
      std::snprintf(buf_, sizeof buf_, "%s vs %s (n=%lld): rel err %.3g > %.3g, max abs %.3g", \
                    #a, #ref, static_cast<long long>(n), e_.rel, static_cast<double>(rel_tol), \
                    e_.max_abs);                                                              \
      pe_test::fail(__FILE__, __LINE__, buf_);                                                \
    }                                                                                         \
  } while (0)

namespace pe_test {
// Runs every registered test (or those whose name contains argv[1]); 0 when all pass.
inline int run_all(int argc, char** argv) {
  int failed_tests = 0, run = 0;
  for (const auto& t : pe_test::registry()) {
    if (argc > 1 && !std::strstr(t.name, argv[1])) continue;
    pe_test::current_failures() = 0;
    ++run;
    try {
      t.fn();
    } catch (const std::exception& e) {
      pe_test::fail(__FILE__, __LINE__, std::string("exception: ") + e.what());
    }
    const int f = pe_test::current_failures();
    std::printf("[%s] %s%s\n", f ? "FAIL" : " ok ", t.name,
                f ? (" (" + std::to_string(f) + " checks)").c_str() : "");
    failed_tests += f ? 1 : 0;
  }
  std::printf("%d/%d tests passed\n", run - failed_tests, run);
  return failed_tests == 0 ? 0 : 1;
}
}  // namespace pe_test

#ifndef PE_TEST_NO_MAIN
int main(int argc, char** argv) { return pe_test::run_all(argc, argv); }
#endif
