// safetensors reader/writer/checkpoint: round trips, sharding, and one broken file per validation rule.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sala {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            fmt::format("sala_st_{}_{}_{}", ::getpid(), counter++, std::random_device{}());
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Random bytes in 1..255, so no test can pass by reading zeros.
std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(1, 255);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(dist(rng));
  return v;
}

// Writes a safetensors file by hand: 8-byte little-endian length, header text, data bytes.
void write_raw(const fs::path& path, const std::string& header, const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(char(n >> (8 * i)));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// The message of the sala::Error that f throws (a test failure if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sala::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected sala::Error, nothing was thrown";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

// Opening `path` fails with a message naming the file and each of `parts`.
void expect_open_error(const fs::path& path, std::initializer_list<std::string> parts) {
  std::string msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_CONTAINS(msg, path.string());
  for (const auto& p : parts) EXPECT_CONTAINS(msg, p);
}

bool same_bytes(const TensorView& v, const std::vector<uint8_t>& expected) {
  return v.nbytes() == expected.size() && std::equal(expected.begin(), expected.end(), v.bytes().begin());
}

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                                DType::F8_E5M2, DType::I64, DType::I32, DType::I16, DType::I8,
                                DType::U64, DType::U32, DType::U16, DType::U8, DType::BOOL};

// ---------------------------------------------------------------------------------------------
// Writer -> reader

TEST(SafetensorsWriter, RoundTripEveryDType) {
  TempDir dir;
  std::vector<std::vector<uint8_t>> data;
  std::vector<Shape> shapes;
  SafetensorsWriter writer;
  uint32_t seed = 1;
  for (DType t : kAllDTypes) {
    Shape shape = {int64_t(seed % 3 + 1), 5, 3};
    shapes.push_back(shape);
    data.push_back(random_bytes(size_t(shape_numel(shape)) * dtype_size(t), seed++));
    writer.add(std::string("t.") + std::string(dtype_name(t)), TensorView{data.back().data(), t, shape});
  }
  writer.write(dir / "all.safetensors");

  SafetensorsFile file(dir / "all.safetensors");
  ASSERT_EQ(file.tensors().size(), std::size(kAllDTypes));
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const TensorView& v = file.get(std::string("t.") + std::string(dtype_name(kAllDTypes[i])));
    EXPECT_EQ(v.dtype, kAllDTypes[i]);
    EXPECT_EQ(v.shape, shapes[i]);
    EXPECT_TRUE(same_bytes(v, data[i])) << dtype_name(kAllDTypes[i]);
  }
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_FALSE(fs::exists(dir / "all.safetensors.tmp"));
}

TEST(SafetensorsWriter, HeaderInInsertionOrderPaddedAndContiguous) {
  TempDir dir;
  auto a = random_bytes(12, 1), b = random_bytes(6, 2);
  SafetensorsWriter writer;
  writer.add("zeta", TensorView{a.data(), DType::F32, {3}});
  writer.add("alpha", TensorView{b.data(), DType::U8, {2, 3}});
  writer.write(dir / "o.safetensors");

  std::ifstream in(dir / "o.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(n));
  EXPECT_LT(header.find("\"zeta\""), header.find("\"alpha\""));
  auto h = json::parse(header);
  EXPECT_EQ(h["zeta"]["data_offsets"], json({0, 12}));
  EXPECT_EQ(h["alpha"]["data_offsets"], json({12, 18}));
  EXPECT_FALSE(h.contains("__metadata__"));  // only written when non-empty
  EXPECT_EQ(bytes.size(), 8 + n + 18);
}

TEST(SafetensorsWriter, MetadataRoundTrip) {
  TempDir dir;
  auto a = random_bytes(4, 3);
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "random \"quoted\" ünïcode");
  writer.add("x", TensorView{a.data(), DType::BF16, {2}});
  writer.write(dir / "m.safetensors");
  SafetensorsFile file(dir / "m.safetensors");
  std::map<std::string, std::string> expected = {{"format", "pt"}, {"note", "random \"quoted\" ünïcode"}};
  EXPECT_EQ(file.metadata(), expected);
  EXPECT_FALSE(file.contains("__metadata__"));
}

TEST(SafetensorsWriter, ZeroSizeAndScalarTensors) {
  TempDir dir;
  auto a = random_bytes(8, 4), s = random_bytes(4, 5);
  SafetensorsWriter writer;
  writer.add("empty", TensorView{nullptr, DType::F32, {0, 4}});
  writer.add("a", TensorView{a.data(), DType::F16, {4}});
  writer.add("scalar", TensorView{s.data(), DType::I32, {}});
  writer.write(dir / "z.safetensors");
  SafetensorsFile file(dir / "z.safetensors");
  EXPECT_EQ(file.get("empty").shape, Shape({0, 4}));
  EXPECT_EQ(file.get("empty").nbytes(), 0u);
  EXPECT_TRUE(same_bytes(file.get("a"), a));
  EXPECT_EQ(file.get("scalar").shape, Shape{});
  EXPECT_TRUE(same_bytes(file.get("scalar"), s));
}

TEST(SafetensorsWriter, ProducerFillsTensorLazily) {
  TempDir dir;
  auto expected = random_bytes(3 * 7 * 2, 6);
  SafetensorsWriter writer;
  int calls = 0;
  writer.add("lazy", DType::BF16, {3, 7}, [&](uint8_t* dst) {
    ++calls;
    std::copy(expected.begin(), expected.end(), dst);
  });
  writer.write(dir / "p.safetensors");
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(same_bytes(SafetensorsFile(dir / "p.safetensors").get("lazy"), expected));
}

TEST(SafetensorsWriter, FailedWriteKeepsOldFileAndRemovesTmp) {
  TempDir dir;
  auto a = random_bytes(4, 7);
  SafetensorsWriter good;
  good.add("x", TensorView{a.data(), DType::U8, {4}});
  good.write(dir / "f.safetensors");

  SafetensorsWriter bad;
  bad.add("y", DType::U8, {4}, [](uint8_t*) { fail("producer broke"); });
  EXPECT_THROW(bad.write(dir / "f.safetensors"), Error);
  EXPECT_FALSE(fs::exists(dir / "f.safetensors.tmp"));
  EXPECT_TRUE(same_bytes(SafetensorsFile(dir / "f.safetensors").get("x"), a));
}

TEST(SafetensorsWriter, RejectsDuplicateAndInvalidNames) {
  auto a = random_bytes(4, 8);
  SafetensorsWriter writer;
  writer.add("x", TensorView{a.data(), DType::U8, {4}});
  EXPECT_CONTAINS(error_of([&] { writer.add("x", TensorView{a.data(), DType::U8, {4}}); }), "'x'");
  EXPECT_THROW(writer.add("__metadata__", TensorView{a.data(), DType::U8, {4}}), Error);
  EXPECT_CONTAINS(error_of([&] { writer.add("neg", DType::U8, {-1}, [](uint8_t*) {}); }), "'neg'");
}

// ---------------------------------------------------------------------------------------------
// MappedFile

TEST(SafetensorsMappedFile, EmptyFileMapsWithSizeZero) {
  TempDir dir;
  write_bytes(dir / "empty", {});
  MappedFile f(dir / "empty");
  EXPECT_EQ(f.size(), 0u);
}

TEST(SafetensorsMappedFile, MissingFileNamesPath) {
  TempDir dir;
  std::string msg = error_of([&] { MappedFile f(dir / "nope.safetensors"); });
  EXPECT_CONTAINS(msg, (dir / "nope.safetensors").string());
}

TEST(SafetensorsMappedFile, DirectoryIsRejected) {
  TempDir dir;
  EXPECT_CONTAINS(error_of([&] { MappedFile f(dir.path()); }), dir.path().string());
}

// ---------------------------------------------------------------------------------------------
// Validation of broken files: each message names the file and, where there is one, the tensor.

TEST(SafetensorsFile, TruncatedFile) {
  TempDir dir;
  write_bytes(dir / "t.safetensors", {1, 2, 3});
  expect_open_error(dir / "t.safetensors", {"3 bytes"});
  write_bytes(dir / "e.safetensors", {});
  expect_open_error(dir / "e.safetensors", {"0 bytes"});
}

TEST(SafetensorsFile, HeaderLengthPastEof) {
  TempDir dir;
  write_bytes(dir / "h.safetensors", {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'});
  expect_open_error(dir / "h.safetensors", {"header length 100"});
}

TEST(SafetensorsFile, HeaderLengthInsane) {
  TempDir dir;
  write_bytes(dir / "h.safetensors", {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'});
  expect_open_error(dir / "h.safetensors", {"header length"});
}

TEST(SafetensorsFile, InvalidJson) {
  TempDir dir;
  write_raw(dir / "j.safetensors", R"({"w": {"dtype": "F32",)", {});
  expect_open_error(dir / "j.safetensors", {"JSON"});
}

TEST(SafetensorsFile, NonObjectHeader) {
  TempDir dir;
  write_raw(dir / "a.safetensors", "[1, 2]", {});
  expect_open_error(dir / "a.safetensors", {"object", "array"});
}

TEST(SafetensorsFile, UnknownDType) {
  TempDir dir;
  write_raw(dir / "d.safetensors", R"({"w.unk": {"dtype": "F128", "shape": [2], "data_offsets": [0, 32]}})",
            random_bytes(32, 1));
  expect_open_error(dir / "d.safetensors", {"'w.unk'", "F128"});
}

TEST(SafetensorsFile, DTypeNotAString) {
  TempDir dir;
  write_raw(dir / "d.safetensors", R"({"w.num": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "d.safetensors", {"'w.num'", "dtype"});
}

TEST(SafetensorsFile, BadShapeType) {
  TempDir dir;
  write_raw(dir / "s.safetensors", R"({"w.str": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "s.safetensors", {"'w.str'", "shape"});
  write_raw(dir / "f.safetensors", R"({"w.flt": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "f.safetensors", {"'w.flt'", "2.5"});
}

TEST(SafetensorsFile, NegativeShape) {
  TempDir dir;
  write_raw(dir / "n.safetensors", R"({"w.neg": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "n.safetensors", {"'w.neg'", "-2"});
}

TEST(SafetensorsFile, BadDataOffsetsType) {
  TempDir dir;
  write_raw(dir / "o.safetensors", R"({"w.off": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "o.safetensors", {"'w.off'", "data_offsets"});
  write_raw(dir / "m.safetensors", R"({"w.none": {"dtype": "F32", "shape": [2]}})", random_bytes(8, 1));
  expect_open_error(dir / "m.safetensors", {"'w.none'", "data_offsets"});
}

TEST(SafetensorsFile, OffsetsOutOfRange) {
  TempDir dir;
  write_raw(dir / "r.safetensors", R"({"w.far": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
            random_bytes(16, 1));
  expect_open_error(dir / "r.safetensors", {"'w.far'", "24"});
}

TEST(SafetensorsFile, BeginAfterEnd) {
  TempDir dir;
  write_raw(dir / "b.safetensors", R"({"w.rev": {"dtype": "U8", "shape": [4], "data_offsets": [12, 8]}})",
            random_bytes(16, 1));
  expect_open_error(dir / "b.safetensors", {"'w.rev'", "12", "8"});
}

TEST(SafetensorsFile, SizeMismatch) {
  TempDir dir;
  write_raw(dir / "z.safetensors", R"({"w.size": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})",
            random_bytes(16, 1));
  expect_open_error(dir / "z.safetensors", {"'w.size'", "16 bytes", "12"});
}

TEST(SafetensorsFile, OverlappingTensors) {
  TempDir dir;
  write_raw(dir / "o.safetensors",
            R"({"first": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "second": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            random_bytes(16, 1));
  expect_open_error(dir / "o.safetensors", {"'first'", "'second'", "overlap"});
}

TEST(SafetensorsFile, DuplicateTensorNames) {
  TempDir dir;
  write_raw(dir / "d.safetensors",
            R"({"twice": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "twice": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
            random_bytes(8, 1));
  expect_open_error(dir / "d.safetensors", {"duplicate", "'twice'"});

  write_raw(dir / "k.safetensors", R"({"w.dup": {"dtype": "U8", "dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})",
            random_bytes(4, 1));
  expect_open_error(dir / "k.safetensors", {"duplicate", "'w.dup'", "'dtype'"});
}

TEST(SafetensorsFile, MetadataMustBeStrings) {
  TempDir dir;
  write_raw(dir / "m.safetensors", R"({"__metadata__": {"step": 5}})", {});
  expect_open_error(dir / "m.safetensors", {"__metadata__", "step"});
}

TEST(SafetensorsFile, GetUnknownTensorNamesFileAndTensor) {
  TempDir dir;
  write_raw(dir / "g.safetensors", "{}", {});
  SafetensorsFile f(dir / "g.safetensors");
  std::string msg = error_of([&] { f.get("missing.weight"); });
  EXPECT_CONTAINS(msg, (dir / "g.safetensors").string());
  EXPECT_CONTAINS(msg, "missing.weight");
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

// Tensors for the sharded tests: distinct random contents, ~100 bytes each.
struct Sample {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::pair<std::string, TensorView>> views() const {
    std::vector<std::pair<std::string, TensorView>> v;
    for (size_t i = 0; i < names.size(); ++i)
      v.push_back({names[i], TensorView{data[i].data(), DType::BF16, {int64_t(data[i].size() / 2)}}});
    return v;
  }
};

Sample make_sample(int n) {
  Sample s;
  for (int i = 0; i < n; ++i) {
    s.names.push_back(fmt::format("model.layers.{}.weight", i));
    s.data.push_back(random_bytes(size_t(80 + 8 * i), uint32_t(100 + i)));
  }
  return s;
}

TEST(SafetensorsCheckpoint, ShardedWriteThenLoad) {
  TempDir dir;
  Sample s = make_sample(7);
  auto shards = write_sharded(dir.path(), s.views(), 200);
  ASSERT_GT(shards.size(), 2u);
  EXPECT_EQ(shards[0].filename().string(), fmt::format("model-00001-of-{:05d}.safetensors", shards.size()));

  std::ifstream in(dir / "model.safetensors.index.json");
  json index = json::parse(in);
  size_t total = 0;
  for (const auto& d : s.data) total += d.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), s.names.size());

  Checkpoint ckpt(dir.path());
  EXPECT_EQ(ckpt.files().size(), shards.size());
  ASSERT_EQ(ckpt.tensors().size(), s.names.size());
  for (size_t i = 0; i < s.names.size(); ++i) {
    EXPECT_TRUE(same_bytes(ckpt.get(s.names[i]), s.data[i])) << s.names[i];
    EXPECT_EQ(ckpt.file_of(s.names[i]).filename().string(), index["weight_map"][s.names[i]].get<std::string>());
  }
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_CONTAINS(error_of([&] { ckpt.get("lm_head.weight"); }), "lm_head.weight");

  // The index file itself is accepted as the checkpoint path.
  EXPECT_EQ(Checkpoint(dir / "model.safetensors.index.json").tensors().size(), s.names.size());
}

TEST(SafetensorsCheckpoint, SingleFileAndDirectoryForms) {
  TempDir dir;
  Sample s = make_sample(3);
  SafetensorsWriter writer;
  for (const auto& [name, view] : s.views()) writer.add(name, view);
  writer.write(dir / "model.safetensors");
  EXPECT_EQ(Checkpoint(dir.path()).tensors().size(), 3u);
  EXPECT_EQ(Checkpoint(dir / "model.safetensors").tensors().size(), 3u);

  // No index and no model.safetensors: every *.safetensors of the directory.
  TempDir loose;
  SafetensorsWriter w1, w2;
  auto v = s.views();
  w1.add(v[0].first, v[0].second);
  w2.add(v[1].first, v[1].second);
  w2.add(v[2].first, v[2].second);
  w1.write(loose / "a.safetensors");
  w2.write(loose / "b.safetensors");
  Checkpoint ckpt(loose.path());
  EXPECT_EQ(ckpt.tensors().size(), 3u);
  EXPECT_TRUE(same_bytes(ckpt.get(s.names[2]), s.data[2]));
  EXPECT_EQ(ckpt.file_of(s.names[0]).filename().string(), "a.safetensors");
}

TEST(SafetensorsCheckpoint, MissingPathOrEmptyDirectory) {
  TempDir dir;
  EXPECT_CONTAINS(error_of([&] { Checkpoint c(dir / "absent"); }), (dir / "absent").string());
  EXPECT_CONTAINS(error_of([&] { Checkpoint c(dir.path()); }), dir.path().string());
}

// Writes one shard holding the given sample tensors.
void write_shard(const fs::path& path, const Sample& s, std::initializer_list<size_t> which) {
  SafetensorsWriter w;
  auto v = s.views();
  for (size_t i : which) w.add(v[i].first, v[i].second);
  w.write(path);
}

void write_index(const fs::path& dir, const json& weight_map) {
  std::ofstream(dir / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", weight_map}};
}

TEST(SafetensorsCheckpoint, IndexPointsAtMissingShard) {
  TempDir dir;
  Sample s = make_sample(2);
  write_shard(dir / "one.safetensors", s, {0});
  write_index(dir.path(), {{s.names[0], "one.safetensors"}, {s.names[1], "gone.safetensors"}});
  std::string msg = error_of([&] { Checkpoint c(dir.path()); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "gone.safetensors");
  EXPECT_CONTAINS(msg, s.names[1]);
}

TEST(SafetensorsCheckpoint, IndexTensorMissingFromItsShard) {
  TempDir dir;
  Sample s = make_sample(2);
  write_shard(dir / "one.safetensors", s, {0});
  write_index(dir.path(), {{s.names[0], "one.safetensors"}, {s.names[1], "one.safetensors"}});
  std::string msg = error_of([&] { Checkpoint c(dir.path()); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "one.safetensors");
  EXPECT_CONTAINS(msg, s.names[1]);
}

TEST(SafetensorsCheckpoint, IndexNamesWrongShard) {
  TempDir dir;
  Sample s = make_sample(2);
  write_shard(dir / "one.safetensors", s, {0});
  write_shard(dir / "two.safetensors", s, {1});
  write_index(dir.path(), {{s.names[0], "two.safetensors"}, {s.names[1], "two.safetensors"}});
  std::string msg = error_of([&] { Checkpoint c(dir.path()); });
  EXPECT_CONTAINS(msg, s.names[0]);
  EXPECT_CONTAINS(msg, "two.safetensors");
}

TEST(SafetensorsCheckpoint, TensorInTwoShards) {
  TempDir dir;
  Sample s = make_sample(2);
  write_shard(dir / "one.safetensors", s, {0});
  write_shard(dir / "two.safetensors", s, {0, 1});
  write_index(dir.path(), {{s.names[0], "one.safetensors"}, {s.names[1], "two.safetensors"}});
  std::string msg = error_of([&] { Checkpoint c(dir.path()); });
  EXPECT_CONTAINS(msg, s.names[0]);
  EXPECT_CONTAINS(msg, "one.safetensors");
  EXPECT_CONTAINS(msg, "two.safetensors");

  // The same without an index.
  fs::remove(dir / "model.safetensors.index.json");
  EXPECT_CONTAINS(error_of([&] { Checkpoint c(dir.path()); }), s.names[0]);
}

TEST(SafetensorsCheckpoint, BrokenIndex) {
  TempDir dir;
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": [";
  EXPECT_CONTAINS(error_of([&] { Checkpoint c(dir.path()); }), "model.safetensors.index.json");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": 3}})";
  std::string msg = error_of([&] { Checkpoint c(dir.path()); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "'w'");
}

}  // namespace
}  // namespace sala
