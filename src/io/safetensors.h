// safetensors checkpoints: an mmap'ed reader with zero-copy views, sharded loading through
// model.safetensors.index.json, and an atomic writer. Every structural problem of a file is an
// error that names the file (and the tensor, where there is one).
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sala {

// A read-only memory mapping of a whole file (RAII).
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file, validated on open: header length, JSON, dtype names, shapes, offsets
// inside the data section, byte size == numel * dtype size, no overlaps, no duplicate names.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return file_->path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // throws naming file and tensor

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: either model.safetensors, or the shards listed by
// model.safetensors.index.json (each listed tensor must be found in the shard the index names),
// or, lacking both, every *.safetensors in the directory. A tensor name in two files is an error.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& dir_or_file);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // merged over files
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;
  const std::filesystem::path& file_of(const std::string& name) const;
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::filesystem::path> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::filesystem::path> owner_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file atomically (to "<path>.tmp", fsync, rename). Tensors are written in
// the order they were added; data can come from a view or be produced lazily by a callback, so a
// converter never holds a whole model twice.
class SafetensorsWriter {
 public:
  using Producer = std::function<void(uint8_t* dst)>;  // must fill exactly nbytes
  void set_metadata(const std::string& key, const std::string& value);
  void add(const std::string& name, const TensorView& view);  // data copied at write()
  void add(const std::string& name, DType dtype, const Shape& shape, Producer produce);
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    Producer produce;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes a sharded checkpoint (shards of at most max_shard_bytes + index.json) from one writer's
// entries; used by tests and by converters. Returns the shard paths.
std::vector<std::filesystem::path> write_sharded(const std::filesystem::path& dir,
                                                 const std::vector<std::pair<std::string, TensorView>>& tensors,
                                                 size_t max_shard_bytes);

}  // namespace sala
