// The structs behind the opaque handles of pyengine.h.
#pragma once
#include <memory>

#include "engine/engine.h"
#include "model/model.h"

struct pe_model {
  std::unique_ptr<pe::Model> model;
  bool finalized = false;
};

struct pe_engine {
  std::unique_ptr<pe::Engine> engine;
};
