#include "server/sparse_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/table.h"

namespace harrier {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return SplitMix(h);
}

// A uniform draw in [0, 1) from 24 bits of a hash.
float Unit(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

constexpr int kSketchRows = 4;
constexpr size_t kSketchWidth = size_t{1} << 16;
constexpr int kEvictionSamples = 8;

}  // namespace

absl::StatusOr<SparseRowsConfig> SparseRowsConfig::FromProto(
    const proto::SparseTableConfig& config) {
  SparseRowsConfig out;
  if (config.dim() == 0 || config.dim() > kMaxSparseDim) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table: dim ", config.dim(),
                                                   " outside [1, ", kMaxSparseDim, "]"));
  }
  out.dim = config.dim();
  const std::string& optimizer = config.optimizer();
  if (optimizer.empty() || optimizer == "sgd") {
    out.optimizer = SparseOptimizerKind::kSgd;
  } else if (optimizer == "adagrad") {
    out.optimizer = SparseOptimizerKind::kAdagrad;
  } else if (optimizer == "rowwise_adagrad") {
    out.optimizer = SparseOptimizerKind::kRowwiseAdagrad;
  } else if (optimizer == "adam") {
    out.optimizer = SparseOptimizerKind::kAdam;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table: optimizer '", optimizer.substr(0, 64),
                     "' is not one of sgd, adagrad, rowwise_adagrad, adam"));
  }
  auto check = [](const char* field, float value, float low, float high) -> absl::Status {
    if (!std::isfinite(value) || value < low || value > high) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table: ", field, " ", value,
                                                     " outside [", low, ", ", high, "]"));
    }
    return absl::OkStatus();
  };
  for (const auto& [field, value, low, high] :
       {std::make_tuple("lr", config.lr(), 0.0f, 1e6f),
        std::make_tuple("beta1", config.beta1(), 0.0f, 1.0f),
        std::make_tuple("beta2", config.beta2(), 0.0f, 1.0f),
        std::make_tuple("epsilon", config.epsilon(), 0.0f, 1.0f),
        std::make_tuple("initial_accumulator", config.initial_accumulator(), 0.0f, 1e6f),
        std::make_tuple("init_scale", config.init_scale(), 0.0f, 1e6f),
        std::make_tuple("admit_probability", config.admit_probability(), 0.0f, 1.0f)}) {
    if (auto status = check(field, value, low, high); !status.ok()) return status;
  }
  out.lr = config.lr();
  out.beta1 = config.beta1();
  out.beta2 = config.beta2();
  out.epsilon = config.epsilon();
  if (out.optimizer == SparseOptimizerKind::kAdam && (out.beta1 >= 1.0f || out.beta2 >= 1.0f)) {
    return absl::InvalidArgumentError("sparse table: adam needs beta1 and beta2 below 1");
  }
  if (out.optimizer != SparseOptimizerKind::kSgd && out.epsilon <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table: optimizer '", optimizer, "' needs epsilon above 0"));
  }
  out.initial_accumulator = config.initial_accumulator();
  out.init_scale = config.init_scale();
  out.seed = config.seed();
  out.max_rows = config.max_rows();
  if (config.max_bytes() > 0) {
    // What a row costs at most: values, state, its record, and its index
    // slot at the hash map's lowest load.
    const uint64_t per_row = (uint64_t{out.dim} + out.state_floats()) * sizeof(float) +
                             sizeof(SparseRows::RowMeta) + 2 * (sizeof(std::pair<const int64_t, uint32_t>) + 1);
    const uint64_t rows = std::max<uint64_t>(1, config.max_bytes() / per_row);
    out.max_rows = out.max_rows == 0 ? rows : std::min(out.max_rows, rows);
  }
  if (config.eviction().empty() || config.eviction() == "lru") {
    out.eviction = SparseEviction::kLru;
  } else if (config.eviction() == "lfu") {
    out.eviction = SparseEviction::kLfu;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table: eviction '", config.eviction().substr(0, 64), "' is not lru or lfu"));
  }
  if (config.ttl_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table: negative ttl_steps ", config.ttl_steps()));
  }
  out.ttl_steps = config.ttl_steps();
  out.admit_after = config.admit_after();
  out.admit_probability = config.admit_probability() == 0.0f ? 1.0f : config.admit_probability();
  return out;
}

uint32_t SparseRowsConfig::state_floats() const {
  switch (optimizer) {
    case SparseOptimizerKind::kSgd:
      return 0;
    case SparseOptimizerKind::kAdagrad:
      return dim;
    case SparseOptimizerKind::kRowwiseAdagrad:
      return 1;
    case SparseOptimizerKind::kAdam:
      return 2 * dim;
  }
  return 0;
}

SparseRows::SparseRows(std::string name, SparseRowsConfig config, ParamBudget* budget)
    : name_(std::move(name)),
      config_(config),
      name_hash_(HashName(name_) ^ SplitMix(config.seed)),
      budget_(budget) {}

SparseRows::~SparseRows() {
  // One chunk per block, its bytes, and the index's.
  if (budget_ != nullptr) {
    budget_->Release(blocks_.size(), block_bytes_charged_ + index_bytes_charged_);
  }
}

float* SparseRows::ValuesOf(uint32_t slot) {
  return blocks_[slot / kRowsPerBlock].values.get() + size_t{slot % kRowsPerBlock} * config_.dim;
}
const float* SparseRows::ValuesOf(uint32_t slot) const {
  return blocks_[slot / kRowsPerBlock].values.get() + size_t{slot % kRowsPerBlock} * config_.dim;
}
float* SparseRows::StateOf(uint32_t slot) {
  return blocks_[slot / kRowsPerBlock].state.get() +
         size_t{slot % kRowsPerBlock} * config_.state_floats();
}
const float* SparseRows::StateOf(uint32_t slot) const {
  return blocks_[slot / kRowsPerBlock].state.get() +
         size_t{slot % kRowsPerBlock} * config_.state_floats();
}
SparseRows::RowMeta& SparseRows::MetaOf(uint32_t slot) {
  return blocks_[slot / kRowsPerBlock].meta[slot % kRowsPerBlock];
}
const SparseRows::RowMeta& SparseRows::MetaOf(uint32_t slot) const {
  return blocks_[slot / kRowsPerBlock].meta[slot % kRowsPerBlock];
}

void SparseRows::InitialRow(int64_t id, float* out) const {
  const uint64_t base = name_hash_ ^ MixRowId(id);
  const float scale = config_.init_scale;
  for (uint32_t j = 0; j < config_.dim; ++j) {
    out[j] = (2.0f * Unit(SplitMix(base + j)) - 1.0f) * scale;
  }
}

bool SparseRows::AddBlock() {
  const uint64_t bytes =
      uint64_t{kRowsPerBlock} *
      ((uint64_t{config_.dim} + config_.state_floats()) * sizeof(float) + sizeof(RowMeta));
  if (budget_ != nullptr &&
      !budget_->Reserve(absl::StrCat("sparse table '", name_, "' rows"), bytes).ok()) {
    return false;
  }
  if (budget_ != nullptr) block_bytes_charged_ += bytes;
  Block block;
  block.values.reset(new float[size_t{kRowsPerBlock} * config_.dim]);
  if (config_.state_floats() > 0) {
    block.state.reset(new float[size_t{kRowsPerBlock} * config_.state_floats()]);
  }
  block.meta.reset(new RowMeta[kRowsPerBlock]);
  blocks_.push_back(std::move(block));
  return true;
}

bool SparseRows::TakeSlot(uint32_t* slot) {
  if (config_.max_rows > 0 && index_.size() >= config_.max_rows) EvictOne();
  if (!free_.empty()) {
    *slot = free_.back();
    free_.pop_back();
    return true;
  }
  if (slots_used_ < blocks_.size() * kRowsPerBlock || AddBlock()) {
    *slot = slots_used_++;
    return true;
  }
  // The shard's parameter budget is spent: make room in this table.
  if (index_.empty()) return false;
  EvictOne();
  if (free_.empty()) return false;
  *slot = free_.back();
  free_.pop_back();
  return true;
}

void SparseRows::EvictOne() {
  if (index_.empty() || slots_used_ == 0) return;
  uint32_t victim = kFreeSlot;
  int sampled = 0;
  // Sampled eviction (as Redis does): the least recently (or least often)
  // used of a few random rows; no list to keep per row.
  for (int draw = 0; draw < 8 * kEvictionSamples && sampled < kEvictionSamples; ++draw) {
    sample_state_ = SplitMix(sample_state_);
    const uint32_t slot = static_cast<uint32_t>(sample_state_ % slots_used_);
    const RowMeta& meta = MetaOf(slot);
    if (meta.steps == kFreeSlot) continue;
    ++sampled;
    if (victim == kFreeSlot) {
      victim = slot;
      continue;
    }
    const RowMeta& best = MetaOf(victim);
    const bool older = config_.eviction == SparseEviction::kLru
                           ? meta.last_used < best.last_used
                           : (meta.uses < best.uses ||
                              (meta.uses == best.uses && meta.last_used < best.last_used));
    if (older) victim = slot;
  }
  if (victim == kFreeSlot) {
    // Mostly free slots: take the first row held.
    victim = index_.begin()->second;
  }
  Remove(victim, /*expired=*/false);
}

void SparseRows::Remove(uint32_t slot, bool expired) {
  RowMeta& meta = MetaOf(slot);
  index_.erase(meta.id);
  if (track_changes_) dirty_[meta.id] = false;
  meta.steps = kFreeSlot;
  free_.push_back(slot);
  ++evicted_;
  if (expired) ++expired_;
}

bool SparseRows::Admit(int64_t id) {
  if (config_.admit_after <= 1 && config_.admit_probability >= 1.0f) return true;
  // Occurrences are counted whenever admission is not immediate: the draw
  // below is then a new one on each push of an id not yet admitted.
  if (sketch_.empty()) sketch_.assign(kSketchRows * kSketchWidth, 0);
  const uint64_t mixed = MixRowId(id) ^ name_hash_;
  uint32_t count = ~0u;
  for (int row = 0; row < kSketchRows; ++row) {
    const uint64_t h = SplitMix(mixed + static_cast<uint64_t>(row) * 0x632be59bd9b4e019ull);
    uint16_t& counter = sketch_[row * kSketchWidth + (h % kSketchWidth)];
    if (counter < 0xffff) ++counter;
    count = std::min<uint32_t>(count, counter);
  }
  if (count < config_.admit_after) return false;
  if (config_.admit_probability >= 1.0f) return true;
  // A draw per (id, occurrence): the same pushes admit the same ids.
  return Unit(SplitMix(MixRowId(id) ^ name_hash_ ^ (uint64_t{count} << 32))) <
         config_.admit_probability;
}

uint32_t SparseRows::Store(int64_t id, int64_t clock) {
  uint32_t slot;
  if (!TakeSlot(&slot)) return kFreeSlot;
  InitialRow(id, ValuesOf(slot));
  const uint32_t state = config_.state_floats();
  if (state > 0) {
    const float first = config_.optimizer == SparseOptimizerKind::kAdam
                            ? 0.0f
                            : config_.initial_accumulator;
    std::fill_n(StateOf(slot), state, first);
  }
  RowMeta& meta = MetaOf(slot);
  meta.id = id;
  meta.last_used = clock;
  meta.uses = 0;
  meta.steps = 0;
  index_.emplace(id, slot);
  if (budget_ != nullptr) {
    const uint64_t index_bytes =
        index_.capacity() * (sizeof(std::pair<const int64_t, uint32_t>) + 1);
    if (index_bytes > index_bytes_charged_) {
      budget_->AddBytes(index_bytes - index_bytes_charged_);
      index_bytes_charged_ = index_bytes;
    }
  }
  if (track_changes_) dirty_[id] = true;
  ++admitted_;
  return slot;
}

void SparseRows::Lookup(int64_t id, int64_t clock, float* out) {
  auto it = index_.find(id);
  uint32_t slot;
  if (it != index_.end()) {
    slot = it->second;
  } else {
    const bool at_once = config_.admit_after <= 1 && config_.admit_probability >= 1.0f;
    slot = at_once ? Store(id, clock) : kFreeSlot;
    if (slot == kFreeSlot) {
      InitialRow(id, out);
      return;
    }
  }
  RowMeta& meta = MetaOf(slot);
  meta.last_used = std::max(meta.last_used, clock);
  if (meta.uses < ~0u - 1) ++meta.uses;
  std::memcpy(out, ValuesOf(slot), sizeof(float) * config_.dim);
}

void SparseRows::StepRow(uint32_t slot, const float* gradient, float scale, float* values,
                         float* state, uint32_t steps) const {
  (void)slot;
  const uint32_t dim = config_.dim;
  const float lr = config_.lr;
  switch (config_.optimizer) {
    case SparseOptimizerKind::kSgd:
      for (uint32_t j = 0; j < dim; ++j) values[j] -= lr * scale * gradient[j];
      return;
    case SparseOptimizerKind::kAdagrad:
      for (uint32_t j = 0; j < dim; ++j) {
        const float g = scale * gradient[j];
        state[j] += g * g;
        values[j] -= lr * g / (std::sqrt(state[j]) + config_.epsilon);
      }
      return;
    case SparseOptimizerKind::kRowwiseAdagrad: {
      double squares = 0;
      for (uint32_t j = 0; j < dim; ++j) {
        const float g = scale * gradient[j];
        squares += double{g} * g;
      }
      state[0] += static_cast<float>(squares / dim);
      const float step = lr / (std::sqrt(state[0]) + config_.epsilon);
      for (uint32_t j = 0; j < dim; ++j) values[j] -= step * scale * gradient[j];
      return;
    }
    case SparseOptimizerKind::kAdam: {
      float* m = state;
      float* v = state + dim;
      const double t = static_cast<double>(steps) + 1.0;
      const float correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, t));
      const float correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, t));
      for (uint32_t j = 0; j < dim; ++j) {
        const float g = scale * gradient[j];
        m[j] = config_.beta1 * m[j] + (1.0f - config_.beta1) * g;
        v[j] = config_.beta2 * v[j] + (1.0f - config_.beta2) * g * g;
        const float m_hat = m[j] / correction1;
        const float v_hat = v[j] / correction2;
        values[j] -= lr * m_hat / (std::sqrt(v_hat) + config_.epsilon);
      }
      return;
    }
  }
}

void SparseRows::Apply(int64_t id, const float* gradient, float scale, int64_t clock) {
  auto it = index_.find(id);
  uint32_t slot;
  if (it != index_.end()) {
    slot = it->second;
  } else {
    if (!Admit(id)) {
      ++not_admitted_;
      return;
    }
    slot = Store(id, clock);
    if (slot == kFreeSlot) {
      ++not_admitted_;
      return;
    }
  }
  RowMeta& meta = MetaOf(slot);
  StepRow(slot, gradient, scale, ValuesOf(slot), StateOf(slot), meta.steps);
  ++meta.steps;
  meta.last_used = std::max(meta.last_used, clock);
  if (meta.uses < ~0u - 1) ++meta.uses;
  if (track_changes_) dirty_[id] = true;
}

void SparseRows::Expire(int64_t clock, size_t budget) {
  if (config_.ttl_steps <= 0 || slots_used_ == 0) return;
  for (size_t looked = 0; looked < budget && looked < slots_used_; ++looked) {
    if (sweep_next_ >= slots_used_) sweep_next_ = 0;
    const uint32_t slot = sweep_next_++;
    const RowMeta& meta = MetaOf(slot);
    if (meta.steps == kFreeSlot) continue;
    if (clock - meta.last_used > config_.ttl_steps) Remove(slot, /*expired=*/true);
  }
}

bool SparseRows::Find(int64_t id, std::vector<float>* values) const {
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  if (values != nullptr) {
    const float* row = ValuesOf(it->second);
    values->assign(row, row + config_.dim);
  }
  return true;
}

SparseRows::Dump SparseRows::Export(bool changed_only) const {
  Dump dump;
  const uint32_t dim = config_.dim;
  const uint32_t state = config_.state_floats();
  auto add = [&](int64_t id, uint32_t slot) {
    dump.ids.push_back(id);
    const float* row = ValuesOf(slot);
    dump.values.insert(dump.values.end(), row, row + dim);
    if (state > 0) {
      const float* s = StateOf(slot);
      dump.state.insert(dump.state.end(), s, s + state);
    }
    dump.steps.push_back(MetaOf(slot).steps);
  };
  if (changed_only) {
    for (const auto& [id, written] : dirty_) {
      auto it = index_.find(id);
      if (written && it != index_.end()) {
        add(id, it->second);
      } else if (it == index_.end()) {
        dump.removed.push_back(id);
      }
    }
  } else {
    dump.ids.reserve(index_.size());
    dump.values.reserve(index_.size() * dim);
    for (const auto& [id, slot] : index_) add(id, slot);
  }
  return dump;
}

void SparseRows::TrackChanges(bool on) {
  track_changes_ = on;
  if (!on) dirty_.clear();
}

void SparseRows::MarkClean() { dirty_.clear(); }

absl::Status SparseRows::Import(const Dump& dump) {
  const uint32_t dim = config_.dim;
  const uint32_t state = config_.state_floats();
  if (dump.values.size() != dump.ids.size() * dim ||
      dump.state.size() != dump.ids.size() * state || dump.steps.size() != dump.ids.size()) {
    return absl::DataLossError(absl::StrCat("sparse table '", name_, "': a saved row set of ",
                                            dump.ids.size(), " ids has ", dump.values.size(),
                                            " values and ", dump.state.size(), " state floats"));
  }
  for (int64_t id : dump.removed) {
    auto it = index_.find(id);
    if (it != index_.end()) {
      const uint32_t slot = it->second;
      Remove(slot, /*expired=*/false);
      --evicted_;
    }
  }
  for (size_t i = 0; i < dump.ids.size(); ++i) {
    const int64_t id = dump.ids[i];
    uint32_t slot;
    auto it = index_.find(id);
    if (it != index_.end()) {
      slot = it->second;
    } else {
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      } else {
        if (slots_used_ >= blocks_.size() * kRowsPerBlock) {
          // A restore may go over the budget (what was held before).
          const uint64_t bytes =
              uint64_t{kRowsPerBlock} * ((uint64_t{dim} + state) * sizeof(float) + sizeof(RowMeta));
          if (budget_ != nullptr) {
            budget_->Add(bytes);
            block_bytes_charged_ += bytes;
          }
          Block block;
          block.values.reset(new float[size_t{kRowsPerBlock} * dim]);
          if (state > 0) block.state.reset(new float[size_t{kRowsPerBlock} * state]);
          block.meta.reset(new RowMeta[kRowsPerBlock]);
          blocks_.push_back(std::move(block));
        }
        slot = slots_used_++;
      }
      index_.emplace(id, slot);
      MetaOf(slot).id = id;
      MetaOf(slot).last_used = 0;
      MetaOf(slot).uses = 0;
    }
    std::memcpy(ValuesOf(slot), dump.values.data() + i * dim, sizeof(float) * dim);
    if (state > 0) std::memcpy(StateOf(slot), dump.state.data() + i * state, sizeof(float) * state);
    MetaOf(slot).steps = dump.steps[i] == kFreeSlot ? 0 : dump.steps[i];
  }
  return absl::OkStatus();
}

SparseRowsStats SparseRows::stats() const {
  SparseRowsStats stats;
  stats.rows = index_.size();
  stats.admitted = admitted_;
  stats.evicted = evicted_;
  stats.expired = expired_;
  stats.not_admitted_pushes = not_admitted_;
  const uint64_t block_bytes =
      uint64_t{kRowsPerBlock} *
      ((uint64_t{config_.dim} + config_.state_floats()) * sizeof(float) + sizeof(RowMeta));
  stats.reserved_bytes = blocks_.size() * block_bytes +
                         index_.capacity() * (sizeof(std::pair<const int64_t, uint32_t>) + 1) +
                         sketch_.size() * sizeof(uint16_t);
  stats.bytes_per_row =
      stats.rows == 0 ? 0.0 : static_cast<double>(stats.reserved_bytes) / stats.rows;
  stats.raw_row_bytes = (uint64_t{config_.dim} + config_.state_floats()) * sizeof(float);
  return stats;
}

}  // namespace harrier
