// Reads the reference cases written by tests/ref/loomref.py.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::test {

// A tensor read from a .ref file, owning its bytes.
struct RefTensor {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<unsigned char> bytes;

  Tensor view() { return Tensor(bytes.data(), dtype, shape); }
  std::vector<float> floats() const;  // f32/bf16/f16 data as float
  float scalar() const { return floats().at(0); }
};

class RefCase {
 public:
  // Loads ${LOOM_REF_DIR}/<file>; fails the test (throws) if missing.
  explicit RefCase(const std::string& file);
  RefTensor& operator[](const std::string& name);
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

 private:
  std::string path_;
  std::map<std::string, RefTensor> tensors_;
};

}  // namespace loom::test
