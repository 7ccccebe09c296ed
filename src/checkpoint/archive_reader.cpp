// Reads a torch.save archive (a zip of a pickle and storage records) into
// an IValue: lamp's own unpickler, for the opcodes torch.save writes.
//
// NOTE: over 500 lines for one concern: the unpickler's opcode loop
// (Reader) with the stack and memo every opcode shares; split, that state
// would cross files.

#include "archive.h"
#include "member_reader.h"
#include "zip_index.h"

#include <ATen/core/Dict.h>
#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace lamp::detail {
namespace {

// What the pickle machine's stack holds besides values.
struct Item {
  enum class Kind { kValue, kMark, kGlobal, kStorage };
  Kind kind = Kind::kValue;
  c10::IValue value; // kValue
  std::string global; // kGlobal: "module.name"
  c10::Storage storage; // kStorage
  c10::ScalarType dtype = c10::ScalarType::Undefined; // kStorage

  static Item of(c10::IValue v) {
    Item item;
    item.value = std::move(v);
    return item;
  }
};

// `torch.<Name>Storage` → its dtype.
std::optional<c10::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"torch.FloatStorage", c10::kFloat},
      {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},
      {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},
      {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},
      {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},
      {"torch.BoolStorage", c10::kBool},
      {"torch.ComplexFloatStorage", c10::kComplexFloat},
      {"torch.ComplexDoubleStorage", c10::kComplexDouble},
  };
  const auto it = kTypes.find(global);
  if (it == kTypes.end()) {
    return std::nullopt;
  }
  return it->second;
}

// A pickle machine for the weights-only subset of protocols 2 to 5 (see
// Python's pickletools for the opcodes). It calls no code: the few globals
// it knows are interpreted here, any other is an error.
class Reader {
 public:
  Reader(
      std::string path,
      std::string pickle,
      caffe2::serialize::PyTorchStreamReader& zip,
      std::map<std::string, uint32_t> crcs,
      std::map<std::string, c10::Storage> records)
      : path_(std::move(path)),
        data_(std::move(pickle)),
        zip_(zip),
        crcs_(std::move(crcs)),
        records_(std::move(records)) {}

  c10::IValue run() {
    while (true) {
      const auto op = static_cast<uint8_t>(byte());
      if (op == '.') { // STOP
        TORCH_CHECK(stack_.size() == 1, where(), "unbalanced stack at STOP");
        return value(pop());
      }
      step(op);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    TORCH_CHECK(false, where(), why);
  }
  std::string where() const {
    return path_ + ": corrupt or unsupported checkpoint (pickle byte " +
        std::to_string(pos_) + "): ";
  }

  char byte() {
    if (pos_ >= data_.size()) {
      fail("the data ends early (truncated file?)");
    }
    return data_[pos_++];
  }
  std::string bytes(size_t n) {
    if (n > data_.size() - pos_) {
      fail("the data ends early (truncated file?)");
    }
    auto out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t little(size_t n) {
    const auto b = bytes(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      v |= uint64_t(static_cast<uint8_t>(b[i])) << (8 * i);
    }
    return v;
  }
  std::string line() {
    const auto end = data_.find('\n', pos_);
    if (end == std::string::npos) {
      fail("the data ends early (truncated file?)");
    }
    auto out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  Item pop() {
    if (stack_.empty()) {
      fail("stack underflow");
    }
    auto item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  c10::IValue value(Item item) const {
    if (item.kind != Item::Kind::kValue) {
      fail("a value was expected");
    }
    return std::move(item.value);
  }
  // The items above the topmost mark, which is removed.
  std::vector<Item> pop_mark() {
    if (marks_.empty()) {
      fail("no MARK");
    }
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(
        std::make_move_iterator(stack_.begin() + mark),
        std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }
  c10::IValue tuple(std::vector<Item> items) {
    std::vector<c10::IValue> values;
    for (auto& item : items) {
      values.push_back(value(std::move(item)));
    }
    return c10::ivalue::Tuple::create(std::move(values));
  }
  void push(c10::IValue v) {
    stack_.push_back(Item::of(std::move(v)));
  }
  Item& top() {
    if (stack_.empty()) {
      fail("stack underflow");
    }
    return stack_.back();
  }
  void memo_put(size_t index) {
    memo_[index] = top();
  }

  void set_items(c10::IValue& target, std::vector<Item> items) {
    if (!target.isGenericDict() || items.size() % 2 != 0) {
      fail("SETITEMS on something that is not a dict");
    }
    auto dict = target.toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      dict.insert_or_assign(
          value(std::move(items[i])), value(std::move(items[i + 1])));
    }
  }
  void append(c10::IValue& target, std::vector<Item> items) {
    if (!target.isList()) {
      fail("APPEND on something that is not a list");
    }
    auto list = target.toList();
    for (auto& item : items) {
      list.push_back(value(std::move(item)));
    }
  }

  static c10::impl::GenericDict empty_dict() {
    return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  }

  // ('storage', torch.<T>Storage, key, location, numel) → the storage of
  // record data/<key>, shared by every tensor that views it.
  Item persistent(const c10::IValue& pid) {
    if (!pid.isTuple() || pid.toTupleRef().elements().size() != 5) {
      fail("unknown persistent id");
    }
    const auto& e = pid.toTupleRef().elements();
    if (!e[0].isString() || e[0].toStringRef() != "storage" ||
        !e[2].isString()) {
      fail("unknown persistent id");
    }
    const auto dtype =
        e[1].isString() ? dtypes_.find(e[1].toStringRef()) : dtypes_.end();
    if (dtype == dtypes_.end()) {
      fail("unknown storage type");
    }
    Item item;
    item.kind = Item::Kind::kStorage;
    item.dtype = dtype->second;
    const auto key = e[2].toStringRef();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      const std::string record = "data/" + key;
      // Read (and checked) already, in parallel: see read_torch_archive.
      if (auto read = records_.find(record); read != records_.end()) {
        it = storages_.emplace(key, std::move(read->second)).first;
        records_.erase(read);
      }
    }
    if (it == storages_.end()) {
      const std::string record = "data/" + key;
      if (!zip_.hasRecord(record)) {
        fail("the tensor data " + record + " is missing");
      }
      auto [data, size] = zip_.getRecord(record);
      check_crc(record, data.get(), size);
      it = storages_
               .emplace(
                   key,
                   c10::Storage(
                       c10::Storage::use_byte_size_t(),
                       size,
                       std::move(data),
                       /*allocator=*/nullptr,
                       /*resizable=*/false))
               .first;
    }
    item.storage = it->second;
    return item;
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)
  c10::IValue rebuild_tensor(std::vector<Item>& args) {
    if (args.size() < 4 || args[0].kind != Item::Kind::kStorage) {
      fail("malformed tensor");
    }
    const auto& storage = args[0];
    const auto offset = value(std::move(args[1]));
    const auto size = value(std::move(args[2]));
    const auto stride = value(std::move(args[3]));
    if (!offset.isInt() || !size.isTuple() || !stride.isTuple()) {
      fail("malformed tensor");
    }
    std::vector<int64_t> sizes, strides;
    for (const auto& s : size.toTupleRef().elements()) {
      sizes.push_back(s.toInt());
    }
    for (const auto& s : stride.toTupleRef().elements()) {
      strides.push_back(s.toInt());
    }
    if (sizes.size() != strides.size()) {
      fail("malformed tensor");
    }
    // The largest element a view reaches must lie inside its storage.
    const int64_t itemsize = c10::elementSize(storage.dtype);
    int64_t last = offset.toInt();
    bool empty = false;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0 || strides[i] < 0) {
        fail("malformed tensor");
      }
      empty = empty || sizes[i] == 0;
      last += (sizes[i] - 1) * strides[i];
    }
    if (!empty &&
        (offset.toInt() < 0 ||
         (last + 1) * itemsize >
             static_cast<int64_t>(storage.storage.nbytes()))) {
      fail("tensor data shorter than its shape (truncated file?)");
    }
    auto tensor = at::empty({0}, at::TensorOptions().dtype(storage.dtype));
    tensor.set_(storage.storage, offset.toInt(), sizes, strides);
    return tensor;
  }

  // REDUCE: a known global applied to its arguments.
  void reduce() {
    auto args = value(pop());
    auto callable = pop();
    if (callable.kind != Item::Kind::kGlobal || !args.isTuple()) {
      fail("REDUCE of something that is not a known global");
    }
    const auto& g = callable.global;
    if (g == "collections.OrderedDict") {
      push(empty_dict());
      return;
    }
    if (g == "torch._utils._rebuild_tensor_v2") {
      // Its arguments hold a storage, kept aside by tuple_or_args().
      auto items = std::move(reduce_args_);
      reduce_args_.clear();
      push(rebuild_tensor(items));
      return;
    }
    if (g == "torch._utils._rebuild_parameter") {
      const auto& e = args.toTupleRef().elements();
      if (e.empty() || !e[0].isTensor()) {
        fail("malformed parameter");
      }
      push(e[0]); // a parameter is its tensor
      return;
    }
    fail("unsupported global " + g);
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: // PROTO
        byte();
        return;
      case 0x95: // FRAME
        little(8);
        return;
      case '(': // MARK
        marks_.push_back(stack_.size());
        return;
      case '0': // POP
        pop();
        return;
      case '1': // POP_MARK
        pop_mark();
        return;
      case '2': // DUP
        stack_.push_back(top());
        return;
      case 'N':
        push(c10::IValue());
        return;
      case 0x88:
        push(true);
        return;
      case 0x89:
        push(false);
        return;
      case 'J': // BININT
        push(static_cast<int64_t>(static_cast<int32_t>(little(4))));
        return;
      case 'K': // BININT1
        push(static_cast<int64_t>(little(1)));
        return;
      case 'M': // BININT2
        push(static_cast<int64_t>(little(2)));
        return;
      case 0x8a: { // LONG1
        const size_t n = static_cast<uint8_t>(byte());
        if (n > 8) {
          fail("integer wider than 64 bits");
        }
        uint64_t v = n ? little(n) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) {
          v |= ~uint64_t(0) << (8 * n); // sign-extend
        }
        push(static_cast<int64_t>(v));
        return;
      }
      case 'G': { // BINFLOAT, big-endian
        const auto b = bytes(8);
        uint64_t bits = 0;
        for (char c : b) {
          bits = bits << 8 | static_cast<uint8_t>(c);
        }
        double d = 0;
        std::memcpy(&d, &bits, sizeof d);
        push(d);
        return;
      }
      case 'X': // BINUNICODE
      case 'B': // BINBYTES
        push(bytes(little(4)));
        return;
      case 0x8c: // SHORT_BINUNICODE
      case 'C': // SHORT_BINBYTES
        push(bytes(static_cast<uint8_t>(byte())));
        return;
      case 0x8d: // BINUNICODE8
      case 0x8e: // BINBYTES8
        push(bytes(little(8)));
        return;
      case '}': // EMPTY_DICT
        push(empty_dict());
        return;
      case ']': // EMPTY_LIST
        push(c10::impl::GenericList(c10::AnyType::get()));
        return;
      case ')': // EMPTY_TUPLE
        push(c10::ivalue::Tuple::create({}));
        return;
      case 't': { // TUPLE
        auto items = pop_mark();
        tuple_or_args(std::move(items));
        return;
      }
      case 0x85: // TUPLE1
      case 0x86: // TUPLE2
      case 0x87: { // TUPLE3
        const size_t n = op - 0x84;
        if (stack_.size() < n) {
          fail("stack underflow");
        }
        std::vector<Item> items(
            std::make_move_iterator(stack_.end() - n),
            std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - n);
        tuple_or_args(std::move(items));
        return;
      }
      case 'l': { // LIST
        c10::IValue list = c10::impl::GenericList(c10::AnyType::get());
        append(list, pop_mark());
        push(list);
        return;
      }
      case 'd': { // DICT
        c10::IValue dict = empty_dict();
        set_items(dict, pop_mark());
        push(dict);
        return;
      }
      case 'a': { // APPEND
        auto item = pop();
        std::vector<Item> items;
        items.push_back(std::move(item));
        append(top().value, std::move(items));
        return;
      }
      case 'e': { // APPENDS
        auto items = pop_mark();
        append(top().value, std::move(items));
        return;
      }
      case 's': { // SETITEM
        auto v = pop();
        auto k = pop();
        std::vector<Item> items;
        items.push_back(std::move(k));
        items.push_back(std::move(v));
        set_items(top().value, std::move(items));
        return;
      }
      case 'u': { // SETITEMS
        auto items = pop_mark();
        set_items(top().value, std::move(items));
        return;
      }
      case 'q': // BINPUT
        memo_put(little(1));
        return;
      case 'r': // LONG_BINPUT
        memo_put(little(4));
        return;
      case 0x94: // MEMOIZE
        memo_put(memo_.size());
        return;
      case 'h': // BINGET
      case 'j': { // LONG_BINGET
        const auto it = memo_.find(little(op == 'h' ? 1 : 4));
        if (it == memo_.end()) {
          fail("unknown memo entry");
        }
        stack_.push_back(it->second);
        return;
      }
      case 'c': { // GLOBAL
        const auto module = line();
        const auto name = line();
        global(module + "." + name);
        return;
      }
      case 0x93: { // STACK_GLOBAL
        const auto name = value(pop());
        const auto module = value(pop());
        if (!name.isString() || !module.isString()) {
          fail("malformed STACK_GLOBAL");
        }
        global(module.toStringRef() + "." + name.toStringRef());
        return;
      }
      case 'Q': // BINPERSID
        stack_.push_back(persistent(value(pop())));
        return;
      case 'R': // REDUCE
        reduce();
        return;
      case 'b': { // BUILD: only OrderedDict's `_metadata`, dropped
        pop();
        if (!top().value.isGenericDict()) {
          fail("BUILD of something that is not a dict");
        }
        return;
      }
      default:
        fail("unsupported pickle opcode " + std::to_string(op));
    }
  }

  // NOTE: a tuple that holds a storage is the argument tuple of
  // _rebuild_tensor_v2; storages are no IValues, so it is kept aside (the
  // REDUCE that follows takes it) and an empty tuple stands in for it.
  void tuple_or_args(std::vector<Item> items) {
    for (const auto& item : items) {
      if (item.kind == Item::Kind::kStorage) {
        reduce_args_ = std::move(items);
        push(c10::ivalue::Tuple::create({}));
        return;
      }
    }
    push(tuple(std::move(items)));
  }

  void global(const std::string& name) {
    Item item;
    item.kind = Item::Kind::kGlobal;
    item.global = name;
    if (const auto dtype = storage_dtype(name)) {
      // Storage classes appear only inside persistent ids: as a string.
      dtypes_[name] = *dtype;
      stack_.push_back(Item::of(name));
      return;
    }
    if (name != "collections.OrderedDict" &&
        name != "torch._utils._rebuild_tensor_v2" &&
        name != "torch._utils._rebuild_parameter") {
      fail(
          "unsupported global " + name +
          " (lamp reads checkpoints of tensors, numbers, strings, lists, "
          "tuples and dicts)");
    }
    stack_.push_back(std::move(item));
  }

  void check_crc(const std::string& record, const void* data, size_t size)
      const {
    const auto it = crcs_.find(record);
    if (it == crcs_.end() || crc32_of(data, size) != it->second) {
      fail("the data of " + record + " fail their checksum (corrupt file)");
    }
  }

  std::string path_;
  std::string data_;
  size_t pos_ = 0;
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::map<std::string, uint32_t> crcs_;
  std::map<std::string, c10::Storage> records_; // "data/<key>" → its bytes
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Item> memo_;
  std::map<std::string, c10::Storage> storages_;
  std::map<std::string, c10::ScalarType> dtypes_;
  std::vector<Item> reduce_args_;
};

} // namespace

c10::IValue read_torch_archive(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  std::string pickle;
  std::map<std::string, uint32_t> crcs;
  std::map<std::string, ZipMember> members;
  try {
    members = zip_members(path);
    for (const auto& [name, member] : members) {
      crcs[name] = member.crc;
    }
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    TORCH_CHECK(zip->hasRecord("data.pkl"), "no data.pkl record");
    auto [data, size] = zip->getRecord("data.pkl");
    TORCH_CHECK(
        crcs.count("data.pkl") &&
            crcs["data.pkl"] == crc32_of(data.get(), size),
        "data.pkl fails its checksum (corrupt file)");
    pickle.assign(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    TORCH_CHECK(
        false,
        path,
        ": not a readable checkpoint (a torch.save zip archive): ",
        e.what_without_backtrace());
  }
  try {
    // Every tensor record at once, by several threads (the unpickler then
    // only looks them up); a compressed one is read when it is met.
    std::vector<std::string> names;
    for (const auto& [name, member] : members) {
      if (name.rfind("data/", 0) == 0) {
        names.push_back(name);
      }
    }
    const int threads = static_cast<int>(
        std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
    auto records = read_stored_members(path, members, names, threads);
    return Reader(
               path,
               std::move(pickle),
               *zip,
               std::move(crcs),
               std::move(records))
        .run();
  } catch (const c10::Error& e) {
    // Record reads (tensor data) fail inside the reader: name the file.
    const std::string what = e.what_without_backtrace();
    TORCH_CHECK(what.rfind(path, 0) == 0, path, ": corrupt checkpoint: ", what);
    throw;
  }
}

} // namespace lamp::detail
