// The structs behind the opaque handles of pyengine.h.
#pragma once
#include <memory>

#include <string>

#include "comm/communicator.h"
#include "engine/engine.h"
#include "engine/tp_group.h"
#include "model/dflash.h"
#include "model/model.h"
#include "model/tp_shard.h"
#include "model/weights.h"

struct pe_model {
  std::unique_ptr<pe::Model> model;
  bool finalized = false;
  std::string device;
  pe::ModelConfig full_config;  // as created (a TP shard's model has the local one)
  // Tensor parallel (pe_model_set_tp): the shard plan, the checkpoint's whole shapes, and on rank 0
  // the leader that sends every forward to the workers. The leader goes first (it stops them).
  std::unique_ptr<pe::TpShard> shard;
  std::unique_ptr<pe::WeightStore> full_shapes;
  std::unique_ptr<pe::TpLeader> tp_leader;
  ~pe_model() { tp_leader.reset(); }
};

struct pe_comm {
  std::unique_ptr<pe::Communicator> comm;
};

struct pe_engine {
  std::unique_ptr<pe::Engine> engine;
};

struct pe_draft {
  std::unique_ptr<pe::DFlashDraft> draft;
  pe_model* target = nullptr;  // not owned; outlives the draft
  bool finalized = false;
};
