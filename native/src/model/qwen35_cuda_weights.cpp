// CUDA model, weight placement: upload (weights as the WeightStore holds them, on-load quantized
// there) or dummy generation, and the fused projections (qwen35_cuda.h explains why).
#ifdef PE_WITH_CUDA  // the CUDA model exists only in builds with the CUDA backend
#include <functional>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"
#include "model/qwen35_cuda.h"
#include "model/qwen35_cuda_parts.h"

namespace pe {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& cfg) { return std::make_unique<CudaQwen35Model>(cfg); }

CudaQwen35Model::CudaQwen35Model(const ModelConfig& cfg) : Model(cfg) {}
CudaQwen35Model::~CudaQwen35Model() = default;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Places a host matrix (any supported format) in device memory.
DevMatrix to_device(const WeightView& v) {
  DevMatrix m;
  m.view = v;
  m.data = Buffer(Device::CUDA, dtype_bytes_for(v.dtype, v.rows * v.cols));
  mem_upload(Device::CUDA, m.data.data(), v.data, m.data.size());
  m.view.data = m.data.data();
  if (v.dtype == DType::FP8_E4M3) {
    const size_t n = static_cast<size_t>(ceil_div(v.rows, v.block) * ceil_div(v.cols, v.block));
    m.scales = Buffer(Device::CUDA, n * sizeof(float));
    mem_upload(Device::CUDA, m.scales.data(), v.block_scale, m.scales.size());
    m.view.block_scale = m.scales.as<float>();
  } else if (v.dtype == DType::I8) {
    m.scales = Buffer(Device::CUDA, static_cast<size_t>(v.rows) * sizeof(float));
    mem_upload(Device::CUDA, m.scales.data(), v.row_scale, m.scales.size());
    m.view.row_scale = m.scales.as<float>();
  } else if (v.dtype == DType::NVFP4) {
    m.group = Buffer(Device::CUDA, static_cast<size_t>(v.rows * (v.cols / 16)));
    mem_upload(Device::CUDA, m.group.data(), v.group_scale, m.group.size());
    m.view.group_scale = m.group.as<uint8_t>();
  }
  return m;
}

// An FP8 part joins a run at a block row of the run's scale grid: after rows that end inside a
// block row (in_proj_a: 48 rows) come zero rows up to the boundary (they take the last block row's
// scale and give zeros no part reads). So in_proj_b joins qkv | z | a: one GEMV per GDN layer
// instead of two (27B: 0.4 MB more read per layer, one ~4 us launch on the step's critical path less).
int64_t join_pad_rows(DType dtype, int64_t run_rows) {
  return dtype == DType::FP8_E4M3 && run_rows % 128 != 0 ? 128 - run_rows % 128 : 0;
}

// A layer matrix in the GEMV tile layout where it tiles (cuda_ops.h, gemv_tile_rows): the
// decode GEMVs then stream each step's 4 KB in one run; every linear path reads the layout.
void tile_for_gemv(DevMatrix& m) {
  const int tile = cuda::gemv_tile_rows(m.view);
  if (tile == 0) return;
  Buffer tiled(Device::CUDA, cuda::tiled_weight_bytes(m.view, tile));  // zero-filled: the padding rows
  m.view = cuda::tile_weight(m.view, tiled.data(), tile, cuda::stream());
  cuda::stream_sync();  // the row-major copy is read until here
  m.data = std::move(tiled);
}

int64_t matrix_bytes(const DevMatrix& m) {
  return static_cast<int64_t>(m.data.size() + m.scales.size() + m.group.size());
}

}  // namespace

const float* CudaQwen35Model::keep_vector(Buffer&& b) {
  weight_bytes_ += static_cast<int64_t>(b.size());
  vectors_.push_back(std::move(b));
  return vectors_.back().as<float>();
}

// Consecutive parts join a run while dtype and cols match (FP8: from a block row of the scale grid,
// join_pad_rows).
Projection CudaQwen35Model::projection(const std::vector<std::string>& names, const MatrixSource& make) const {
  auto dtype_of = [&](const std::string& n) { return weights_.tensors().at(n).dtype; };
  auto shape_of = [&](const std::string& n) { return weights_.tensors().at(n).shape; };
  Projection p;
  std::vector<std::vector<std::string>> runs;
  int64_t run_rows = 0;
  for (const std::string& n : names) {
    const std::string& head = runs.empty() ? n : runs.back().front();
    const bool joins = !runs.empty() && dtype_of(n) == dtype_of(head) && shape_of(n)[1] == shape_of(head)[1] &&
                       (dtype_of(n) != DType::NVFP4 ||
                        weights_.tensors().at(n).global_scale == weights_.tensors().at(head).global_scale);
    if (!joins) {
      runs.emplace_back();
      run_rows = 0;
    }
    run_rows += join_pad_rows(dtype_of(n), run_rows);
    p.part_run.push_back(static_cast<int32_t>(runs.size() - 1));
    p.part_col.push_back(run_rows);
    runs.back().push_back(n);
    run_rows += shape_of(n)[0];
  }
  for (const auto& r : runs) {
    p.run_offset.push_back(p.width);
    p.runs.push_back(make(r));
    p.width += p.runs.back().view.rows;
  }
  return p;
}

// Host concatenation of the run's matrices (already in their final format: checkpoint or
// on-load quantized per tensor, the same weights the CPU model uses), then one upload. FP8 runs
// concatenate their block-scale grids (rows are block aligned), I8 their row scales, NVFP4 their
// group scales (one global scale: projection() joins only equal ones).
DevMatrix CudaQwen35Model::upload_run(const std::vector<std::string>& names) {
  WeightView v = weights_.matrix(names.front());
  std::vector<uint8_t> bytes, groups;
  std::vector<float> scales;
  if (names.size() > 1) {
    v.rows = 0;
    for (const std::string& n : names) {
      const Tensor& t = weights_.get(n);
      const int64_t pad = join_pad_rows(v.dtype, v.rows);  // zero rows: e4m3 0x00 is 0
      bytes.insert(bytes.end(), static_cast<size_t>(pad * v.cols), uint8_t(0));
      v.rows += pad;
      bytes.insert(bytes.end(), t.bytes.begin(), t.bytes.end());
      scales.insert(scales.end(), t.f32.begin(), t.f32.end());
      groups.insert(groups.end(), t.group_scale.begin(), t.group_scale.end());
      v.rows += t.shape[0];
    }
    v.data = bytes.data();
    if (v.dtype == DType::FP8_E4M3) v.block_scale = scales.data();
    if (v.dtype == DType::I8) v.row_scale = scales.data();
    if (v.dtype == DType::NVFP4) v.group_scale = groups.data();
  }
  DevMatrix m = to_device(v);
  tile_for_gemv(m);
  weight_bytes_ += matrix_bytes(m);
  return m;
}

DevMatrix CudaQwen35Model::dummy_run(const std::vector<std::string>& names, DType dtype, uint64_t seed) {
  const Tensor& first = weights_.tensors().at(names.front());
  DevMatrix m;
  m.view.dtype = dtype;
  m.view.cols = first.shape[1];
  for (const std::string& n : names)
    m.view.rows += join_pad_rows(dtype, m.view.rows) + weights_.tensors().at(n).shape[0];
  const int64_t n = m.view.rows * m.view.cols;
  const float scale = dummy_scale(names.front(), first);
  m.data = Buffer(Device::CUDA, dtype_bytes_for(dtype, n));
  m.view.data = m.data.data();
  seed ^= std::hash<std::string>()(names.front());
  if (dtype == DType::FP8_E4M3) {
    cuda::fill_random(m.data.data(), dtype, n, seed, 1.0f);  // values in [-1, 1), times the block scale
    const int64_t ns = ceil_div(m.view.rows, 128) * ceil_div(m.view.cols, 128);
    m.scales = Buffer(Device::CUDA, static_cast<size_t>(ns) * sizeof(float));
    cuda::fill_f32(m.scales.as<float>(), ns, scale);
    m.view.block_scale = m.scales.as<float>();
  } else {
    cuda::fill_random(m.data.data(), dtype, n, seed, scale);
  }
  tile_for_gemv(m);  // random bytes either way; tiled as real weights are, for the same kernels
  weight_bytes_ += matrix_bytes(m);
  return m;
}

void CudaQwen35Model::build_layers(const MatrixSource& make,
                                   const std::function<const float*(const std::string&)>& vec) {
  layers_.clear();
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    DevLayer L;
    L.full = cfg_.is_full_attention[i];
    L.input_norm = vec(p + "input_layernorm.weight");
    L.post_norm = vec(p + "post_attention_layernorm.weight");
    L.gate_up = projection({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, make);
    L.down = projection({p + "mlp.down_proj.weight"}, make);
    if (L.full) {
      const std::string a = p + "self_attn.";
      L.in = projection({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, make);
      L.out = projection({a + "o_proj.weight"}, make);
      L.q_norm = vec(a + "q_norm.weight");
      L.k_norm = vec(a + "k_norm.weight");
    } else {
      const std::string g = p + "linear_attn.";
      L.in = projection({g + "in_proj_qkv.weight", g + "in_proj_z.weight", g + "in_proj_a.weight",
                         g + "in_proj_b.weight"},
                        make);
      L.out = projection({g + "out_proj.weight"}, make);
      L.conv = vec(g + "conv1d.weight");
      L.dt_bias = vec(g + "dt_bias");
      L.A_log = vec(g + "A_log");
      L.norm = vec(g + "norm.weight");
    }
    layers_.push_back(std::move(L));
  }
  final_norm_ = vec("norm.weight");
}

void CudaQwen35Model::finalize() {
  weights_.finalize();
  if (weight_quant_ != DType::F32) weights_.quantize(weight_quant_);  // per tensor, as on the CPU
  auto vec = [&](const std::string& name) {
    const Tensor& t = weights_.get(name);
    Buffer b(Device::CUDA, t.f32.size() * sizeof(float));
    mem_upload(Device::CUDA, b.data(), t.f32.data(), b.size());
    return keep_vector(std::move(b));
  };
  build_layers([&](const std::vector<std::string>& names) { return upload_run(names); }, vec);
  embed_ = to_device(weights_.matrix("embed_tokens.weight"));
  weight_bytes_ += matrix_bytes(embed_);
  if (!cfg_.tied_embeddings) {
    lm_head_ = to_device(weights_.matrix("lm_head.weight"));
    weight_bytes_ += matrix_bytes(lm_head_);
  }
  weights_.drop_host_matrices();  // the device copies are the weights from here on
  cuda::stream_sync();
  ready_ = true;
}

void CudaQwen35Model::load_dummy(DType matrix_dtype, uint64_t seed) {
  if (matrix_dtype != DType::F32 && matrix_dtype != DType::F16 && matrix_dtype != DType::BF16 &&
      matrix_dtype != DType::FP8_E4M3)
    fail(PE_ERR_INVALID_ARGUMENT, "dummy weights: matrix dtype ", dtype_name(matrix_dtype), " is not supported");
  if (weight_quant_ != DType::F32)
    fail(PE_ERR_UNSUPPORTED, "weight_quant with dummy weights on cuda: generate the dummy weights in the target format "
                             "(fp8) instead");
  // Embeddings and lm_head stay 16-bit, as in the FP8 checkpoints.
  const DType big = matrix_dtype == DType::FP8_E4M3 ? DType::BF16 : matrix_dtype;
  for (const auto& [name, t] : weights_.tensors())
    if (t.required)
      weights_.mark_present(name, t.kind == TensorKind::Vector ? DType::F32
                                  : (name == "embed_tokens.weight" || name == "lm_head.weight") ? big
                                                                                                : matrix_dtype);
  uint64_t index = 0;
  auto vec = [&](const std::string& name) {
    const Tensor& t = weights_.tensors().at(name);
    Buffer b(Device::CUDA, static_cast<size_t>(t.numel()) * sizeof(float));
    cuda::fill_random(b.data(), DType::F32, t.numel(), seed * 7919u + (++index), dummy_scale(name, t));
    return keep_vector(std::move(b));
  };
  build_layers([&](const std::vector<std::string>& names) { return dummy_run(names, matrix_dtype, seed); }, vec);
  embed_ = dummy_run({"embed_tokens.weight"}, big, seed);
  if (!cfg_.tied_embeddings) lm_head_ = dummy_run({"lm_head.weight"}, big, seed);
  cuda::stream_sync();
  ready_ = true;
}

}  // namespace pe

#endif  // PE_WITH_CUDA
