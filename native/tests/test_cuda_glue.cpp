// The model's glue ops (kernels/cuda/model_glue.h) against their CPU twins: token ids fed from
// sampled ids, head gathers out of
// fused projection rows, in-place l2 norms of q/k heads inside the conv output rows, and the
// sampling penalties (vs cpu::apply_penalties on the same history), and the attention inputs
// (q/gate split, q/k norms and RoPE in one launch, vs cpu::attention_inputs).
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/cpu/kv_codec.h"
#include "kernels/cuda/model_glue.h"
#include "kernels/ops.h"
#include "kernels/sampling.h"
#include "test_cuda_util.h"

using namespace pe;
using pe_test::DevBuf;

TEST(cuda_feed_tokens) {
  pe_test::Rng rng(7);
  for (int64_t n : {1, 3, 17, 300}) {
    std::vector<int32_t> tokens(n), from(n), sampled(n + 5), ref(n);
    for (int64_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>(rng.next() % 1000);
      from[i] = i % 3 == 1 ? -1 : static_cast<int32_t>(rng.next() % (n + 5));
    }
    for (auto& s : sampled) s = static_cast<int32_t>(rng.next() % 200000);
    for (int64_t i = 0; i < n; ++i) ref[i] = from[i] >= 0 ? sampled[from[i]] : tokens[i];
    DevBuf<int32_t> dt(tokens), df(from), ds(sampled);
    cuda::feed_tokens(dt.p, df.p, ds.p, n, nullptr);
    CHECK(dt.download() == ref);
  }
}

TEST(cuda_gather_heads) {
  pe_test::Rng rng(1);
  struct Case { int64_t heads, head_stride, dim, extra; };
  for (const Case& c : {Case{1, 0, 48, 7}, Case{4, 128, 64, 3}, Case{24, 512, 256, 2048}, Case{2, 32, 32, 0}})
    for (int64_t n : {1, 3, 17, 65}) {
      const int64_t stride = c.heads * std::max(c.head_stride, c.dim) + c.extra;
      const auto src = rng.normals(n * stride);
      std::vector<float> ref(n * c.heads * c.dim);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < c.heads; ++h)
          std::memcpy(&ref[(t * c.heads + h) * c.dim], &src[t * stride + h * c.head_stride], sizeof(float) * c.dim);
      DevBuf<float> ds(src), dd(ref.size());
      cuda::gather_heads(ds.p, n, stride, c.heads, c.head_stride, c.dim, dd.p, nullptr);
      EXPECT_CLOSE("gather_heads", cfgs("n=%lld heads=%lld dim=%lld", (long long)n, (long long)c.heads, (long long)c.dim),
                   dd.download(), ref, 0.0);
    }
}

TEST(cuda_l2_norm_heads) {
  pe_test::Rng rng(2);
  struct Case { int64_t heads, dim, stride_extra; float scale; };
  for (const Case& c : {Case{2, 32, 64, 0.17f}, Case{16, 128, 4096, 0.088f}, Case{3, 24, 0, 1.0f}})
    for (int64_t n : {1, 3, 17, 63, 1000}) {
      const int64_t stride = c.heads * c.dim + c.stride_extra;
      const auto x = rng.normals(n * stride, 2.0f);
      std::vector<float> ref = x;
      for (int64_t t = 0; t < n; ++t) cpu::l2_norm(ref.data() + t * stride, c.heads, c.dim, 1e-6f, c.scale);
      DevBuf<float> dx(x);
      cuda::l2_norm_heads(dx.p, n, stride, c.heads, c.dim, 1e-6f, c.scale, nullptr);
      EXPECT_CLOSE("l2_norm_heads", cfgs("n=%lld heads=%lld dim=%lld", (long long)n, (long long)c.heads, (long long)c.dim),
                   dx.download(), ref, 1e-5);
    }
}

TEST(cuda_apply_penalties) {
  pe_test::Rng rng(3);
  const int64_t V = 1000;
  for (int trial = 0; trial < 12; ++trial) {
    SamplingConfig p;
    p.repetition_penalty = trial % 3 == 0 ? 1.0f : 1.0f + 0.1f * static_cast<float>(trial);
    p.presence_penalty = trial % 2 ? 0.4f : 0.0f;
    p.frequency_penalty = trial % 4 < 2 ? 0.3f : 0.0f;
    const int64_t n_prompt = rng.below(50), n_out = rng.below(40);
    std::vector<int32_t> prompt(n_prompt), out(n_out);
    for (auto& t : prompt) t = static_cast<int32_t>(rng.below(120));  // overlapping ids, repeats
    for (auto& t : out) t = static_cast<int32_t>(rng.below(120));
    const auto logits = rng.normals(V, 4.0f);
    std::vector<float> ref = logits;
    cpu::apply_penalties(ref.data(), V, p, prompt.data(), n_prompt, out.data(), n_out);
    // The table the CUDA model builds: distinct ids (prompt ids only with a repetition penalty)
    // and output counts (zero without presence/frequency).
    const bool rep = p.repetition_penalty != 1.0f;
    std::map<int32_t, int32_t> counts;
    if (rep)
      for (int32_t t : prompt) counts[t] += 0;
    for (int32_t t : out) ++counts[t];
    std::vector<int32_t> ids, cnt;
    for (auto [id, c] : counts) {
      ids.push_back(id);
      cnt.push_back(p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f ? 0 : c);
    }
    DevBuf<float> dl(logits);
    DevBuf<int32_t> di(ids.empty() ? std::vector<int32_t>{0} : ids), dc(cnt.empty() ? std::vector<int32_t>{0} : cnt);
    cuda::apply_penalties(dl.p, di.p, dc.p, static_cast<int32_t>(ids.size()), p, nullptr);
    EXPECT_CLOSE("apply_penalties", cfgs("trial=%d prompt=%lld out=%lld", trial, (long long)n_prompt, (long long)n_out),
                 dl.download(), ref, 1e-6);  // the GPU fuses frequency * count + presence (1 ulp)
  }
}

TEST(cuda_attention_inputs) {
  pe_test::Rng rng(4);
  struct Case { int64_t Hq, Hkv, D, rot; float theta; };
  for (const Case& c : {Case{1, 1, 4, 2, 1e4f}, Case{4, 2, 48, 16, 1e6f}, Case{6, 2, 128, 128, 1e4f},
                        Case{24, 4, 256, 64, 1e7f}, Case{3, 1, 512, 0, 1e4f}})
    for (int64_t T : {1, 3, 17}) {
      const int64_t q_stride = c.Hq * 2 * c.D + 2 * c.Hkv * c.D + 7, kv_stride = c.Hkv * c.D + 9;
      const auto qg = rng.normals(T * q_stride, 2.0f), k_in = rng.normals(T * kv_stride, 2.0f),
                 v_in = rng.normals(T * kv_stride), qw = rng.normals(c.D, 0.3f), kw = rng.normals(c.D, 0.3f);
      std::vector<int32_t> pos(T);
      for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(rng.below(262144));
      std::vector<float> q(T * c.Hq * c.D), gate(q.size()), k(T * c.Hkv * c.D), v(k.size());
      cpu::attention_inputs({qg.data(), q_stride, k_in.data(), kv_stride, v_in.data(), kv_stride, qw.data(), kw.data(),
                             pos.data(), T, c.Hq, c.Hkv, c.D, c.rot, 1e-6f, c.theta, q.data(), gate.data(), k.data(),
                             v.data()});
      DevBuf<float> dqg(qg), dk_in(k_in), dv_in(v_in), dqw(qw), dkw(kw), dq(q.size()), dgate(q.size()), dk(k.size()),
          dv(v.size());
      DevBuf<int32_t> dpos(pos);
      cpu::AttnInputArgs a{dqg.p, q_stride, dk_in.p, kv_stride, dv_in.p, kv_stride, dqw.p, dkw.p, dpos.p, T, c.Hq,
                           c.Hkv, c.D, c.rot, 1e-6f, c.theta, dq.p, dgate.p, dk.p, dv.p};
      cuda::attention_inputs(a, nullptr);
      const std::string cfg = cfgs("Hq=%lld Hkv=%lld D=%lld rot=%lld T=%lld", (long long)c.Hq, (long long)c.Hkv,
                                   (long long)c.D, (long long)c.rot, (long long)T);
      EXPECT_CLOSE("attention_inputs q", cfg, dq.download(), q, 1e-5);
      EXPECT_CLOSE("attention_inputs k", cfg, dk.download(), k, 1e-5);
      EXPECT_CLOSE("attention_inputs gate", cfg, dgate.download(), gate, 0.0);
      EXPECT_CLOSE("attention_inputs v", cfg, dv.download(), v, 0.0);
      // k and v in place (dense rows, as the CPU model passes them).
      std::vector<float> kd(k.size()), vd(v.size());
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(&k_in[t * kv_stride], c.Hkv * c.D, &kd[t * c.Hkv * c.D]);
        std::copy_n(&v_in[t * kv_stride], c.Hkv * c.D, &vd[t * c.Hkv * c.D]);
      }
      DevBuf<float> dkd(kd), dvd(vd);
      a.k_in = a.k = dkd.p;
      a.v_in = a.v = dvd.p;
      a.k_stride = a.v_stride = c.Hkv * c.D;
      cuda::attention_inputs(a, nullptr);
      EXPECT_CLOSE("attention_inputs k in place", cfg, dkd.download(), k, 1e-5);
      EXPECT_CLOSE("attention_inputs v in place", cfg, dvd.download(), v, 0.0);
    }
}

namespace {
// A paged cache in device memory (poisoned, so rows nobody writes compare equal too).
struct TestCache {
  DevBuf<uint8_t> k, v;
  DevBuf<float> ks, vs;
  cpu::PagedKV view;
  TestCache(DType t, int64_t rows, const cpu::KvRowFormat& f, int64_t page, int64_t hkv, int64_t d)
      : k(rows * f.bytes), v(rows * f.bytes), ks(std::max<int64_t>(rows * f.scales, 1)),
        vs(std::max<int64_t>(rows * f.scales, 1)),
        view{t, k.p, v.p, f.scales ? ks.p : nullptr, f.scales ? vs.p : nullptr, page, hkv, d} {}
};
}  // namespace

// attention_inputs writing k and v into the paged cache: the same bytes and scales as its dense
// k / v put there by cuda::kv_write (tested against cpu::kv_write in test_cuda_attention), and
// the same q and gate, for every cache dtype; tokens on shuffled pages of 7 rows.
TEST(cuda_attention_inputs_to_cache) {
  pe_test::Rng rng(5);
  struct Case { int64_t Hq, Hkv, D, rot; };
  const DType kinds[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};
  for (const Case& c : {Case{4, 2, 64, 16}, Case{6, 3, 16, 16}, Case{24, 4, 256, 64}, Case{3, 1, 512, 0}})
    for (DType kvt : kinds)
      for (int64_t T : {1, 3, 17}) {
        const int64_t page = 7, start = static_cast<int64_t>(rng.below(40)), n_pages = (start + T) / page + 2;
        std::vector<int32_t> pt(n_pages);
        for (int64_t i = 0; i < n_pages; ++i) pt[i] = static_cast<int32_t>(n_pages - 1 - i);
        std::vector<int32_t> pos(T), rows(T);
        for (int64_t t = 0; t < T; ++t) {
          pos[t] = static_cast<int32_t>(start + t);
          rows[t] = static_cast<int32_t>(pt[(start + t) / page] * page + (start + t) % page);
        }
        const int64_t q_stride = c.Hq * 2 * c.D, kv_stride = c.Hkv * c.D;
        const auto qg = rng.normals(T * q_stride, 2.0f), k_in = rng.normals(T * kv_stride, 2.0f),
                   v_in = rng.normals(T * kv_stride), qw = rng.normals(c.D, 0.3f), kw = rng.normals(c.D, 0.3f);
        DevBuf<float> dqg(qg), dk_in(k_in), dv_in(v_in), dqw(qw), dkw(kw), dk(T * kv_stride), dv(T * kv_stride);
        DevBuf<int32_t> dpos(pos), drows(rows), dpt(pt);
        const cpu::KvRowFormat fmt = cpu::kv_row_format(kvt, c.D);
        const int64_t n_rows = n_pages * page * c.Hkv;
        TestCache dense(kvt, n_rows, fmt, page, c.Hkv, c.D), fused(kvt, n_rows, fmt, page, c.Hkv, c.D);
        DevBuf<float> dq(T * c.Hq * c.D), dgate(T * c.Hq * c.D), fq(T * c.Hq * c.D), fgate(T * c.Hq * c.D);
        cpu::AttnInputArgs a{dqg.p, q_stride, dk_in.p, kv_stride, dv_in.p, kv_stride, dqw.p, dkw.p, dpos.p, T, c.Hq,
                             c.Hkv, c.D, c.rot, 1e-6f, 1e7f, dq.p, dgate.p, dk.p, dv.p};
        cuda::attention_inputs(a, nullptr);
        cuda::kv_write(dense.view, dpt.p, start, T, dk.p, dv.p, nullptr);
        a.q = fq.p;
        a.gate = fgate.p;
        a.k = a.v = nullptr;  // unused with a cache
        cuda::attention_inputs(a, nullptr, &fused.view, drows.p);
        const std::string cfg = cfgs("%s Hq=%lld Hkv=%lld D=%lld T=%lld start=%lld", dtype_name(kvt), (long long)c.Hq,
                                     (long long)c.Hkv, (long long)c.D, (long long)T, (long long)start);
        auto same = [&](const char* what, bool eq) {
          if (!eq) pe_test::fail(__FILE__, __LINE__, std::string("attention_inputs to cache: ") + what + " differ, " + cfg);
        };
        same("K bytes", fused.k.download() == dense.k.download());
        same("V bytes", fused.v.download() == dense.v.download());
        auto bits = [](const std::vector<float>& x, const std::vector<float>& y) {  // the poison is NaN
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
        };
        same("K scales", bits(fused.ks.download(), dense.ks.download()));
        same("V scales", bits(fused.vs.download(), dense.vs.download()));
        same("q", bits(fq.download(), dq.download()));
        same("gate", bits(fgate.download(), dgate.download()));
      }
}
