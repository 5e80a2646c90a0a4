#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sala {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reference implementation refuses headers above 100 MB; a real one is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text() { return std::strerror(errno); }

// An owned file descriptor for writing, closed on scope exit.
class OutFile {
 public:
  explicit OutFile(const fs::path& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create '{}': {}", path.string(), errno_text());
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write '{}': {}", path_.string(), errno_text());
      p += w;
      n -= size_t(w);
    }
  }
  // fsync and close, reporting errors (a failed close can mean lost data on network filesystems).
  void finish() {
    if (::fsync(fd_) != 0) fail("cannot fsync '{}': {}", path_.string(), errno_text());
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close '{}': {}", path_.string(), errno_text());
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

// Writes `path` atomically: `fill` writes "<path>.tmp", which is fsync'ed and renamed over `path`.
// On any failure the temporary file is removed and the old `path` (if any) is left untouched.
template <typename Fill>
void write_atomically(const fs::path& path, Fill&& fill) {
  fs::path tmp = path;
  tmp += ".tmp";
  try {
    OutFile out(tmp);
    fill(out);
    out.finish();
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) fail("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  // Make the rename itself durable; failure here is not worth an error (the data is written).
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// Multiplies the dims of a shape, failing (instead of wrapping) when the byte count overflows.
uint64_t checked_nbytes(const Shape& shape, DType dtype, const std::string& file, const std::string& name) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / uint64_t(d))
      fail("{}: tensor '{}': shape {} is too large", file, name, shape_str(shape));
    n *= uint64_t(d);
  }
  return n;
}

// Parses the JSON header and reports the first key repeated within one object: nlohmann::json
// would silently keep only one of them, hiding a corrupt or maliciously crafted file.
json parse_header(const char* text, size_t n, const std::string& file) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate, entry, duplicate_entry;  // entry: the tensor whose object is being parsed
  size_t duplicate_depth = 0;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (open_objects.size() == 1) entry = key;
      if (!open_objects.back().insert(key).second && duplicate.empty()) {
        duplicate = key;
        duplicate_entry = entry;
        duplicate_depth = open_objects.size();
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  if (!header.is_object()) fail("{}: header must be a JSON object, got {}", file, header.type_name());
  if (!duplicate.empty()) {
    if (duplicate_depth == 1) fail("{}: duplicate tensor name '{}' in header", file, duplicate);
    fail("{}: tensor '{}': duplicate key '{}'", file, duplicate_entry, duplicate);
  }
  return header;
}

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}': {}", path.string(), errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    fail("cannot stat '{}': {}", path.string(), why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot map '{}': not a regular file", path.string());
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {  // mmap of length 0 is an error, and an empty file needs no mapping
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string why = errno_text();
      ::close(fd);
      fail("cannot mmap '{}' ({} bytes): {}", path.string(), size_, why);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const fs::path& path) : file_(std::make_shared<MappedFile>(path)) {
  const std::string file = path.string();
  const size_t size = file_->size();
  if (size < 8) fail("{}: file is {} bytes, too short for the 8-byte header length", file, size);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | file_->data()[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {} byte limit", file, header_len, kMaxHeaderBytes);
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", file, header_len, size);

  json header = parse_header(reinterpret_cast<const char*>(file_->data() + 8), header_len, file);
  const uint8_t* data = file_->data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  std::vector<Range> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: '__metadata__' must be an object, got {}", file, entry.type_name());
      for (auto& [key, value] : entry.items()) {
        if (!value.is_string())
          fail("{}: '__metadata__' value of '{}' must be a string, got {}", file, key, value.dump());
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail("{}: tensor '{}': entry must be an object, got {}", file, name, entry.dump());

    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      fail("{}: tensor '{}': 'dtype' must be a string", file, name);
    DType dtype;
    try {
      dtype = parse_dtype(dtype_it->get_ref<const std::string&>());
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", file, name, e.what());
    }

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array())
      fail("{}: tensor '{}': 'shape' must be an array of integers", file, name);
    Shape shape;
    for (const auto& d : *shape_it) {
      if (!d.is_number_integer())
        fail("{}: tensor '{}': shape entry {} is not an integer", file, name, d.dump());
      if (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(INT64_MAX) : d.get<int64_t>() < 0)
        fail("{}: tensor '{}': shape entry {} is out of range", file, name, d.dump());
      shape.push_back(d.get<int64_t>());
    }

    auto offs_it = entry.find("data_offsets");
    if (offs_it == entry.end() || !offs_it->is_array() || offs_it->size() != 2 ||
        !(*offs_it)[0].is_number_unsigned() || !(*offs_it)[1].is_number_unsigned())
      fail("{}: tensor '{}': 'data_offsets' must be two non-negative integers, got {}", file, name,
           offs_it == entry.end() ? std::string("nothing") : offs_it->dump());
    uint64_t begin = (*offs_it)[0].get<uint64_t>(), end = (*offs_it)[1].get<uint64_t>();
    if (begin > end) fail("{}: tensor '{}': data_offsets begin {} > end {}", file, name, begin, end);
    if (end > data_size)
      fail("{}: tensor '{}': data_offsets end {} is past the data section ({} bytes)", file, name, end, data_size);
    uint64_t expected = checked_nbytes(shape, dtype, file, name);
    if (end - begin != expected)
      fail("{}: tensor '{}': data_offsets span {} bytes but {} {} needs {}", file, name, end - begin,
           dtype_name(dtype), shape_str(shape), expected);

    auto [it, inserted] = tensors_.emplace(name, TensorView{data + begin, dtype, std::move(shape)});
    if (begin != end) ranges.push_back({begin, end, &it->first});
  }

  // Two tensors sharing bytes would alias silently; zero-size tensors own no bytes.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, *ranges[i - 1].name, ranges[i - 1].begin,
           ranges[i - 1].end, *ranges[i].name, ranges[i].begin, ranges[i].end);
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor named '{}'", path().string(), name);
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

// Reads model.safetensors.index.json: tensor name -> shard file name, in the order of the index.
std::vector<std::pair<std::string, std::string>> read_index(const fs::path& index_path) {
  const std::string file = index_path.string();
  MappedFile mapped(index_path);
  json index;
  try {
    const char* text = reinterpret_cast<const char*>(mapped.data());
    index = json::parse(text, text + mapped.size());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file, e.what());
  }
  if (!index.is_object()) fail("{}: must be a JSON object", file);
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) fail("{}: 'weight_map' must be an object", file);
  std::vector<std::pair<std::string, std::string>> entries;
  for (auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string() || shard.get_ref<const std::string&>().empty())
      fail("{}: weight_map entry of tensor '{}' must be a file name, got {}", file, tensor, shard.dump());
    entries.emplace_back(tensor, shard.get<std::string>());
  }
  return entries;
}

bool has_extension(const fs::path& p, const char* ext) { return p.extension() == ext; }

// How a checkpoint names itself in errors: its only file, or the directory of its shards.
std::string describe(const std::vector<fs::path>& files) {
  if (files.empty()) return "checkpoint";
  if (files.size() == 1) return "checkpoint '" + files[0].string() + "'";
  return "checkpoint '" + files[0].parent_path().string() + "'";
}

}  // namespace

Checkpoint::Checkpoint(const fs::path& dir_or_file) {
  std::error_code ec;
  auto status = fs::status(dir_or_file, ec);
  if (!fs::exists(status)) fail("checkpoint '{}' does not exist", dir_or_file.string());

  fs::path index_path;
  if (fs::is_directory(status)) {
    if (fs::exists(dir_or_file / "model.safetensors")) {
      files_.push_back(dir_or_file / "model.safetensors");
    } else if (fs::exists(dir_or_file / "model.safetensors.index.json")) {
      index_path = dir_or_file / "model.safetensors.index.json";
    } else {
      for (const auto& e : fs::directory_iterator(dir_or_file))
        if (e.is_regular_file() && has_extension(e.path(), ".safetensors")) files_.push_back(e.path());
      std::sort(files_.begin(), files_.end());
      if (files_.empty())
        fail("checkpoint '{}': no model.safetensors, model.safetensors.index.json or *.safetensors",
             dir_or_file.string());
    }
  } else if (has_extension(dir_or_file, ".json")) {
    index_path = dir_or_file;
  } else {
    files_.push_back(dir_or_file);
  }

  std::vector<std::pair<std::string, std::string>> index;
  if (!index_path.empty()) {
    index = read_index(index_path);
    if (index.empty()) fail("{}: 'weight_map' is empty", index_path.string());
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : index) {
      if (!seen.insert(shard).second) continue;
      fs::path shard_path = index_path.parent_path() / shard;
      if (!fs::exists(shard_path))
        fail("{}: shard '{}' (listed for tensor '{}') does not exist", index_path.string(), shard, tensor);
      files_.push_back(shard_path);
    }
  }

  // Every tensor of every file is loaded, so a tensor in two files is caught even if an index
  // names only one of them.
  for (const auto& path : files_) {
    shards_.push_back(std::make_unique<SafetensorsFile>(path));
    const SafetensorsFile& shard = *shards_.back();
    for (const auto& [name, view] : shard.tensors()) {
      auto [it, inserted] = owner_.emplace(name, path);
      if (!inserted)
        fail("checkpoint '{}': tensor '{}' is in both '{}' and '{}'", dir_or_file.string(), name,
             it->second.string(), path.string());
      tensors_.emplace(name, view);
    }
    for (const auto& [key, value] : shard.metadata()) metadata_.emplace(key, value);
  }

  for (const auto& [tensor, shard] : index) {
    auto it = owner_.find(tensor);
    fs::path expected = index_path.parent_path() / shard;
    if (it == owner_.end() || it->second != expected)
      fail("{}: tensor '{}' is mapped to '{}' but that file has no such tensor", index_path.string(), tensor,
           shard);
  }
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor named '{}'", describe(files_), name);
  return it->second;
}

const fs::path& Checkpoint::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) fail("{}: no tensor named '{}'", describe(files_), name);
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::add(const std::string& name, const TensorView& view) {
  if (view.data == nullptr && view.nbytes() > 0) fail("safetensors writer: tensor '{}' has no data", name);
  TensorView v = view;
  add(name, view.dtype, view.shape, [v](uint8_t* dst) {
    if (v.nbytes() > 0) std::memcpy(dst, v.data, v.nbytes());
  });
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, Producer produce) {
  if (name.empty() || name == "__metadata__") fail("safetensors writer: invalid tensor name '{}'", name);
  for (int64_t d : shape)
    if (d < 0) fail("safetensors writer: tensor '{}' has negative shape {}", name, shape_str(shape));
  for (const auto& e : entries_)
    if (e.name == name) fail("safetensors writer: tensor '{}' added twice", name);
  entries_.push_back({name, dtype, shape, std::move(produce)});
}

void SafetensorsWriter::write(const fs::path& path) const {
  const std::string file = path.string();
  // ordered_json keeps insertion order, so the header lists tensors in the order they were added.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0, largest = 0;
  for (const auto& e : entries_) {
    uint64_t n = checked_nbytes(e.shape, e.dtype, file, e.name);
    auto& entry = header[e.name];
    entry["dtype"] = std::string(dtype_name(e.dtype));
    entry["shape"] = e.shape;
    entry["data_offsets"] = {offset, offset + n};
    offset += n;
    largest = std::max(largest, n);
  }
  std::string text = header.dump();
  // Pad with spaces (allowed by the format) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  write_atomically(path, [&](OutFile& out) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    out.write(len, 8);
    out.write(text.data(), text.size());
    // One buffer, reused for every tensor: peak memory is the largest tensor, never the model.
    std::vector<uint8_t> buffer;
    buffer.reserve(largest);
    for (const auto& e : entries_) {
      buffer.resize(size_t(checked_nbytes(e.shape, e.dtype, file, e.name)));
      e.produce(buffer.data());
      out.write(buffer.data(), buffer.size());
    }
  });
}

// ---------------------------------------------------------------------------------------------
// write_sharded

std::vector<fs::path> write_sharded(const fs::path& dir, const std::vector<std::pair<std::string, TensorView>>& tensors,
                                    size_t max_shard_bytes) {
  // Greedy packing in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<size_t>> groups;
  size_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t n = tensors[i].second.nbytes();
    if (groups.empty() || (current > 0 && current + n > max_shard_bytes)) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(i);
    current += n;
  }
  if (groups.empty()) groups.emplace_back();  // an empty checkpoint is still one (empty) shard

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create directory '{}': {}", dir.string(), ec.message());

  std::vector<fs::path> paths;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total_size = 0;
  for (size_t s = 0; s < groups.size(); ++s) {
    std::string shard = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, groups.size());
    SafetensorsWriter writer;
    writer.set_metadata("format", "pt");
    for (size_t i : groups[s]) {
      if (weight_map.contains(tensors[i].first))
        fail("write_sharded '{}': tensor '{}' given twice", dir.string(), tensors[i].first);
      writer.add(tensors[i].first, tensors[i].second);
      weight_map[tensors[i].first] = shard;
      total_size += tensors[i].second.nbytes();
    }
    paths.push_back(dir / shard);
    writer.write(paths.back());
  }

  nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::string text = index.dump(2) + "\n";
  write_atomically(dir / "model.safetensors.index.json", [&](OutFile& out) { out.write(text.data(), text.size()); });
  return paths;
}

}  // namespace sala
