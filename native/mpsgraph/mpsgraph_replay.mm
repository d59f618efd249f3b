// Replays a recorded program ("lucid.mpsgraph/v1") into a real MPSGraph: one table entry per
// selector, each a direct, typed method call. Mechanical by design: every decision (which
// selector, which arguments, layouts, casts) was taken in Python (lucid/backends/mpsgraph); this
// file only checks that the recorded arguments have the kinds the method takes.
//
// The tables below are read by tests/native/test_mpsgraph_tables.py through clang's AST: the
// selector strings, and the message each entry sends, must equal lucid.backends.mpsgraph.selectors.

#import "mpsgraph_replay.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace lucid::mpsgraph {
namespace {

using Results = NSArray<MPSGraphTensor*>*;

std::string describe_call(const Call& call, size_t index) {
  return "call " + std::to_string(index) + " (" + call.selector + ")";
}

// ---- enum constants ----------------------------------------------------------------------------

struct EnumConstant {
  const char* name;
  const char* type;
  int64_t value;
};

// The constants of the enum types the selector table's arguments and descriptor fields use, by
// name (the recorded program names them). The macro keeps each name and constant one token.
#define LUCID_ENUM(type, constant) {#constant, #type, static_cast<int64_t>(constant)}
// BEGIN ENUM TABLE (read by tests/native/test_mpsgraph_tables.py)
const EnumConstant kEnumConstants[] = {
    LUCID_ENUM(MPSGraphPaddingStyle, MPSGraphPaddingStyleExplicit),
    LUCID_ENUM(MPSGraphPaddingStyle, MPSGraphPaddingStyleTF_VALID),
    LUCID_ENUM(MPSGraphPaddingStyle, MPSGraphPaddingStyleTF_SAME),
    LUCID_ENUM(MPSGraphPaddingStyle, MPSGraphPaddingStyleExplicitOffset),
    LUCID_ENUM(MPSGraphPaddingStyle, MPSGraphPaddingStyleONNX_SAME_LOWER),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutNCHW),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutNHWC),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutOIHW),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutHWIO),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutCHW),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutHWC),
    LUCID_ENUM(MPSGraphTensorNamedDataLayout, MPSGraphTensorNamedDataLayoutHW),
    LUCID_ENUM(MPSGraphPaddingMode, MPSGraphPaddingModeConstant),
    LUCID_ENUM(MPSGraphPaddingMode, MPSGraphPaddingModeReflect),
    LUCID_ENUM(MPSGraphPaddingMode, MPSGraphPaddingModeSymmetric),
    LUCID_ENUM(MPSGraphPaddingMode, MPSGraphPaddingModeClampToEdge),
    LUCID_ENUM(MPSGraphPaddingMode, MPSGraphPaddingModeZero),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeAdd),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeSub),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeMul),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeDiv),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeMin),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeMax),
    LUCID_ENUM(MPSGraphScatterMode, MPSGraphScatterModeSet),
};
// END ENUM TABLE
#undef LUCID_ENUM

// The name of each enum type the tables use (NS_ENUM types are distinct C++ types).
template <typename Enum>
struct EnumType;
#define LUCID_ENUM_TYPE(type)                  \
  template <>                                  \
  struct EnumType<type> {                      \
    static constexpr const char* name = #type; \
  };
LUCID_ENUM_TYPE(MPSGraphPaddingStyle)
LUCID_ENUM_TYPE(MPSGraphTensorNamedDataLayout)
LUCID_ENUM_TYPE(MPSGraphPaddingMode)
LUCID_ENUM_TYPE(MPSGraphScatterMode)
#undef LUCID_ENUM_TYPE

// The value of enum constant `name` of enum type `type`, or why there is none.
std::string enum_value(const std::string& name, const char* type, int64_t* value) {
  for (const EnumConstant& constant : kEnumConstants) {
    if (name != constant.name) continue;
    if (std::strcmp(constant.type, type) != 0) {
      return name + " is a " + constant.type + ", expected a " + type;
    }
    *value = constant.value;
    return "";
  }
  return "unknown " + std::string(type) + " constant '" + name + "'";
}

// The arguments of one recorded call, converted to the types the method takes.
class CallArgs {
 public:
  CallArgs(const Call& call, size_t index,
           const std::unordered_map<int64_t, MPSGraphTensor*>& tensors)
      : call_(call), index_(index), tensors_(tensors) {}

  MPSGraphTensor* tensor(size_t i) const { return lookup(expect(i, ArgKind::Tensor).tensor, i); }

  // A tensor, or nil where the method accepts an absent tensor.
  MPSGraphTensor* optional_tensor(size_t i) const {
    if (at(i).kind == ArgKind::NilObject) return nil;
    return tensor(i);
  }

  NSArray<MPSGraphTensor*>* tensors(size_t i) const {
    const Arg& arg = expect(i, ArgKind::Tensors);
    NSMutableArray<MPSGraphTensor*>* out = [NSMutableArray arrayWithCapacity:arg.ids.size()];
    for (int64_t id : arg.ids) [out addObject:lookup(id, i)];
    return out;
  }

  NSInteger integer(size_t i) const {
    return static_cast<NSInteger>(expect(i, ArgKind::Int).integer);
  }

  NSUInteger uinteger(size_t i) const {
    int64_t value = expect(i, ArgKind::Int).integer;
    if (value < 0) fail(i, "expected a non-negative integer, got " + std::to_string(value));
    return static_cast<NSUInteger>(value);
  }

  float real_float(size_t i) const { return static_cast<float>(real(i)); }

  double real(size_t i) const {
    const Arg& arg = at(i);
    if (arg.kind == ArgKind::Int) return static_cast<double>(arg.integer);
    return expect(i, ArgKind::Double).real;
  }

  BOOL flag(size_t i) const { return expect(i, ArgKind::Bool).integer != 0 ? YES : NO; }

  MPSShape* shape(size_t i) const { return numbers(expect(i, ArgKind::Shape).ints); }

  NSArray<NSNumber*>* ints(size_t i) const {
    const Arg& arg = at(i);
    // An axes list and a shape are both NSArray<NSNumber *>.
    if (arg.kind == ArgKind::Shape) return numbers(arg.ints);
    return numbers(expect(i, ArgKind::Ints).ints);
  }

  MPSDataType dtype(size_t i) const { return data_type(expect(i, ArgKind::DType).name, i); }

  // An enum argument: the constant is looked up by name, and must be of `type` and have the
  // recorded value.
  template <typename Enum>
  Enum enumeration(size_t i) const {
    const Arg& arg = expect(i, ArgKind::Enum);
    int64_t value = 0;
    std::string problem = enum_value(arg.name, EnumType<Enum>::name, &value);
    if (!problem.empty()) fail(i, problem);
    if (arg.integer != value) {
      fail(i, arg.name + " is " + std::to_string(value) + ", the program says " +
                  std::to_string(arg.integer));
    }
    return static_cast<Enum>(value);
  }

  uint32_t uint32(size_t i) const {
    int64_t value = expect(i, ArgKind::Int).integer;
    if (value < 0 || value > static_cast<int64_t>(UINT32_MAX)) {
      fail(i, "expected a 32-bit unsigned integer, got " + std::to_string(value));
    }
    return static_cast<uint32_t>(value);
  }

  NSData* data(size_t i) const {
    const Arg& arg = expect(i, ArgKind::Constant);
    size_t expected = dtype_size(arg.name);
    for (int64_t dim : arg.ints) {
      if (dim < 0) fail(i, "a constant's shape cannot have -1 dimensions");
      expected *= static_cast<size_t>(dim);
    }
    if (expected != arg.bytes.size()) {
      fail(i, "constant data has " + std::to_string(arg.bytes.size()) + " bytes, its shape and " +
                  arg.name + " need " + std::to_string(expected));
    }
    return [NSData dataWithBytes:arg.bytes.data() length:arg.bytes.size()];
  }

  // The name: argument: recorded as nil (names carry no meaning for execution).
  NSString* name(size_t i) const {
    const Arg& arg = at(i);
    if (arg.kind != ArgKind::NilObject) fail(i, "expected nil (a name: argument)");
    return nil;
  }

  MPSGraphConvolution2DOpDescriptor* convolution2d(size_t i) const;
  MPSGraphPooling2DOpDescriptor* pooling2d(size_t i) const;

  Results one(MPSGraphTensor* result) const {
    if (result == nil) throw std::runtime_error(describe_call(call_, index_) + " returned nil");
    return @[ result ];
  }

  Results many(NSArray<MPSGraphTensor*>* results) const {
    if (results == nil) throw std::runtime_error(describe_call(call_, index_) + " returned nil");
    return results;
  }

  [[noreturn]] void fail(size_t i, const std::string& what) const {
    throw std::invalid_argument(describe_call(call_, index_) + ", argument " + std::to_string(i) +
                                ": " + what);
  }

  const Arg& at(size_t i) const {
    if (i >= call_.args.size()) fail(i, "missing");
    return call_.args[i];
  }

 private:
  const Arg& expect(size_t i, ArgKind kind) const {
    const Arg& arg = at(i);
    if (arg.kind != kind) {
      fail(i, std::string("expected ") + arg_kind_name(kind) + ", got " + arg_kind_name(arg.kind));
    }
    return arg;
  }

  MPSGraphTensor* lookup(int64_t id, size_t i) const {
    auto it = tensors_.find(id);
    if (it == tensors_.end()) fail(i, "tensor " + std::to_string(id) + " is not defined yet");
    return it->second;
  }

  MPSDataType data_type(const std::string& name, size_t i) const {
    try {
      return mps_data_type(name);
    } catch (const std::invalid_argument& e) {
      fail(i, e.what());
    }
  }

  static NSArray<NSNumber*>* numbers(const std::vector<int64_t>& values) {
    NSMutableArray<NSNumber*>* out = [NSMutableArray arrayWithCapacity:values.size()];
    for (int64_t v : values) [out addObject:[NSNumber numberWithLongLong:v]];
    return out;
  }

  const Call& call_;
  size_t index_;
  const std::unordered_map<int64_t, MPSGraphTensor*>& tensors_;
};

// ---- descriptors -------------------------------------------------------------------------------

// Converts one descriptor field's recorded value, naming the field on a mismatch.
class FieldValue {
 public:
  FieldValue(const CallArgs& args, size_t arg_index, const std::string& cls, const Field& field)
      : args_(args), arg_index_(arg_index), cls_(cls), field_(field) {}

  NSUInteger uinteger() const {
    int64_t v = expect(ArgKind::Int).integer;
    if (v < 0) fail("expected a non-negative integer, got " + std::to_string(v));
    return static_cast<NSUInteger>(v);
  }
  BOOL flag() const { return expect(ArgKind::Bool).integer != 0 ? YES : NO; }

  // An enum field holds the constant's name.
  template <typename Enum>
  Enum enumeration() const {
    int64_t value = 0;
    std::string problem = enum_value(expect(ArgKind::Enum).name, EnumType<Enum>::name, &value);
    if (!problem.empty()) fail(problem);
    return static_cast<Enum>(value);
  }

  [[noreturn]] void fail(const std::string& what) const {
    args_.fail(arg_index_, cls_ + "." + field_.name + ": " + what);
  }

 private:
  const Arg& expect(ArgKind kind) const {
    if (field_.value.kind != kind) {
      fail(std::string("expected ") + arg_kind_name(kind) + ", got " +
           arg_kind_name(field_.value.kind));
    }
    return field_.value;
  }

  const CallArgs& args_;
  size_t arg_index_;
  const std::string& cls_;
  const Field& field_;
};

template <typename Descriptor>
struct DescriptorField {
  const char* name;
  void (*set)(Descriptor*, const FieldValue&);
};

// The recorded fields of one descriptor argument: the constructor reads its fields by name, the
// setters table sets every other recorded field.
class RecordedDescriptor {
 public:
  RecordedDescriptor(const CallArgs& args, size_t i, const char* cls)
      : args_(args), index_(i), cls_(cls), arg_(args.at(i)) {
    if (arg_.kind != ArgKind::Descriptor) {
      args.fail(i, std::string("expected descriptor, got ") + arg_kind_name(arg_.kind));
    }
    if (arg_.name != cls_) args.fail(i, "expected a " + cls_ + ", got a " + arg_.name);
  }

  FieldValue field(const char* name) const {
    for (const Field& f : arg_.fields) {
      if (f.name == name) return FieldValue(args_, index_, cls_, f);
    }
    args_.fail(index_, cls_ + ": missing constructor field " + name);
  }

  template <typename Descriptor, size_t N, size_t M>
  Descriptor* finish(Descriptor* descriptor, const DescriptorField<Descriptor> (&setters)[N],
                     const char* const (&constructor_fields)[M]) const {
    if (descriptor == nil) args_.fail(index_, cls_ + ": the constructor returned nil");
    for (const Field& f : arg_.fields) {
      bool by_constructor = false;
      for (const char* name : constructor_fields) by_constructor |= f.name == name;
      const DescriptorField<Descriptor>* setter = nullptr;
      for (const auto& entry : setters) {
        if (f.name == entry.name) setter = &entry;
      }
      FieldValue value(args_, index_, cls_, f);
      if (setter == nullptr) value.fail("no such field");
      if (!by_constructor) setter->set(descriptor, value);
    }
    return descriptor;
  }

 private:
  const CallArgs& args_;
  size_t index_;
  std::string cls_;
  const Arg& arg_;
};

// BEGIN DESCRIPTOR TABLES (read by tests/native/test_mpsgraph_tables.py)
const char* const kConvolution2DConstructorFields[] = {
    "strideInX",   "strideInY",    "dilationRateInX", "dilationRateInY",
    "groups",      "paddingLeft",  "paddingRight",    "paddingTop",
    "paddingBottom", "paddingStyle", "dataLayout",    "weightsLayout",
};

const DescriptorField<MPSGraphConvolution2DOpDescriptor> kConvolution2DFields[] = {
    {"strideInX", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setStrideInX:v.uinteger()];
     }},
    {"strideInY", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setStrideInY:v.uinteger()];
     }},
    {"dilationRateInX", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setDilationRateInX:v.uinteger()];
     }},
    {"dilationRateInY", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setDilationRateInY:v.uinteger()];
     }},
    {"groups", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setGroups:v.uinteger()];
     }},
    {"paddingLeft", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingLeft:v.uinteger()];
     }},
    {"paddingRight", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingRight:v.uinteger()];
     }},
    {"paddingTop", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingTop:v.uinteger()];
     }},
    {"paddingBottom", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingBottom:v.uinteger()];
     }},
    {"paddingStyle", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingStyle:v.enumeration<MPSGraphPaddingStyle>()];
     }},
    {"dataLayout", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setDataLayout:v.enumeration<MPSGraphTensorNamedDataLayout>()];
     }},
    {"weightsLayout", [](MPSGraphConvolution2DOpDescriptor* d, const FieldValue& v) {
       [d setWeightsLayout:v.enumeration<MPSGraphTensorNamedDataLayout>()];
     }},
};

const char* const kPooling2DConstructorFields[] = {
    "kernelWidth", "kernelHeight", "strideInX",    "strideInY",
    "dilationRateInX", "dilationRateInY", "paddingLeft", "paddingRight",
    "paddingTop", "paddingBottom", "paddingStyle", "dataLayout",
};

const DescriptorField<MPSGraphPooling2DOpDescriptor> kPooling2DFields[] = {
    {"kernelWidth", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setKernelWidth:v.uinteger()];
     }},
    {"kernelHeight", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setKernelHeight:v.uinteger()];
     }},
    {"strideInX", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setStrideInX:v.uinteger()];
     }},
    {"strideInY", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setStrideInY:v.uinteger()];
     }},
    {"dilationRateInX", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setDilationRateInX:v.uinteger()];
     }},
    {"dilationRateInY", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setDilationRateInY:v.uinteger()];
     }},
    {"paddingLeft", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingLeft:v.uinteger()];
     }},
    {"paddingRight", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingRight:v.uinteger()];
     }},
    {"paddingTop", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingTop:v.uinteger()];
     }},
    {"paddingBottom", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingBottom:v.uinteger()];
     }},
    {"paddingStyle", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setPaddingStyle:v.enumeration<MPSGraphPaddingStyle>()];
     }},
    {"dataLayout", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setDataLayout:v.enumeration<MPSGraphTensorNamedDataLayout>()];
     }},
    {"includeZeroPadToAverage", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setIncludeZeroPadToAverage:v.flag()];
     }},
    {"ceilMode", [](MPSGraphPooling2DOpDescriptor* d, const FieldValue& v) {
       [d setCeilMode:v.flag()];
     }},
};

// The constructors (DESCRIPTORS[...].constructor), fed with the recorded constructor fields.
const auto kConvolution2DConstructor = [](const RecordedDescriptor& r) {
  return [MPSGraphConvolution2DOpDescriptor
      descriptorWithStrideInX:r.field("strideInX").uinteger()
                    strideInY:r.field("strideInY").uinteger()
              dilationRateInX:r.field("dilationRateInX").uinteger()
              dilationRateInY:r.field("dilationRateInY").uinteger()
                       groups:r.field("groups").uinteger()
                  paddingLeft:r.field("paddingLeft").uinteger()
                 paddingRight:r.field("paddingRight").uinteger()
                   paddingTop:r.field("paddingTop").uinteger()
                paddingBottom:r.field("paddingBottom").uinteger()
                 paddingStyle:r.field("paddingStyle").enumeration<MPSGraphPaddingStyle>()
                   dataLayout:r.field("dataLayout").enumeration<MPSGraphTensorNamedDataLayout>()
                weightsLayout:r.field("weightsLayout")
                                  .enumeration<MPSGraphTensorNamedDataLayout>()];
};

const auto kPooling2DConstructor = [](const RecordedDescriptor& r) {
  return [MPSGraphPooling2DOpDescriptor
      descriptorWithKernelWidth:r.field("kernelWidth").uinteger()
                   kernelHeight:r.field("kernelHeight").uinteger()
                      strideInX:r.field("strideInX").uinteger()
                      strideInY:r.field("strideInY").uinteger()
                dilationRateInX:r.field("dilationRateInX").uinteger()
                dilationRateInY:r.field("dilationRateInY").uinteger()
                    paddingLeft:r.field("paddingLeft").uinteger()
                   paddingRight:r.field("paddingRight").uinteger()
                     paddingTop:r.field("paddingTop").uinteger()
                  paddingBottom:r.field("paddingBottom").uinteger()
                   paddingStyle:r.field("paddingStyle").enumeration<MPSGraphPaddingStyle>()
                     dataLayout:r.field("dataLayout").enumeration<MPSGraphTensorNamedDataLayout>()];
};
// END DESCRIPTOR TABLES

MPSGraphConvolution2DOpDescriptor* CallArgs::convolution2d(size_t i) const {
  RecordedDescriptor r(*this, i, "MPSGraphConvolution2DOpDescriptor");
  return r.finish(kConvolution2DConstructor(r), kConvolution2DFields,
                  kConvolution2DConstructorFields);
}

MPSGraphPooling2DOpDescriptor* CallArgs::pooling2d(size_t i) const {
  RecordedDescriptor r(*this, i, "MPSGraphPooling2DOpDescriptor");
  return r.finish(kPooling2DConstructor(r), kPooling2DFields, kPooling2DConstructorFields);
}

// ---- the replay table --------------------------------------------------------------------------

using ReplayFn = Results (*)(MPSGraph*, const CallArgs&);

struct ReplayEntry {
  const char* selector;
  ReplayFn replay;
};

// One entry per selector of lucid.backends.mpsgraph.selectors.SELECTORS, no more, no less; each
// calls its method with the argument types the selector table gives.
// BEGIN REPLAY TABLE (read by tests/native/test_mpsgraph_tables.py)
const ReplayEntry kReplayTable[] = {
    {"placeholderWithShape:dataType:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g placeholderWithShape:a.shape(0) dataType:a.dtype(1) name:a.name(2)]);
     }},
    {"constantWithScalar:shape:dataType:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g constantWithScalar:a.real(0) shape:a.shape(1) dataType:a.dtype(2)]);
     }},
    {"constantWithData:shape:dataType:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g constantWithData:a.data(0) shape:a.shape(1) dataType:a.dtype(2)]);
     }},
    {"coordinateAlongAxis:withShape:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g coordinateAlongAxis:a.integer(0) withShape:a.shape(1) name:a.name(2)]);
     }},
    {"identityWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g identityWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"negativeWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g negativeWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"absoluteWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g absoluteWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"signWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g signWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"squareWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g squareWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"exponentWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g exponentWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"logarithmWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g logarithmWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"squareRootWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g squareRootWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"reverseSquareRootWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reverseSquareRootWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"reciprocalWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reciprocalWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"sinWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g sinWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"cosWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g cosWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"tanWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g tanWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"tanhWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g tanhWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"sigmoidWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g sigmoidWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"erfWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g erfWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"floorWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g floorWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"ceilWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g ceilWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"rintWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g rintWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"notWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g notWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"isNaNWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g isNaNWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"isInfiniteWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g isInfiniteWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"isFiniteWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g isFiniteWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"truncateWithTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g truncateWithTensor:a.tensor(0) name:a.name(1)]);
     }},
    {"additionWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g additionWithPrimaryTensor:a.tensor(0)
                                 secondaryTensor:a.tensor(1)
                                            name:a.name(2)]);
     }},
    {"subtractionWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g subtractionWithPrimaryTensor:a.tensor(0)
                                    secondaryTensor:a.tensor(1)
                                               name:a.name(2)]);
     }},
    {"multiplicationWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g multiplicationWithPrimaryTensor:a.tensor(0)
                                       secondaryTensor:a.tensor(1)
                                                  name:a.name(2)]);
     }},
    {"divisionWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g divisionWithPrimaryTensor:a.tensor(0)
                                 secondaryTensor:a.tensor(1)
                                            name:a.name(2)]);
     }},
    {"powerWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g powerWithPrimaryTensor:a.tensor(0)
                              secondaryTensor:a.tensor(1)
                                         name:a.name(2)]);
     }},
    {"atan2WithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g atan2WithPrimaryTensor:a.tensor(0)
                              secondaryTensor:a.tensor(1)
                                         name:a.name(2)]);
     }},
    {"maximumWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g maximumWithPrimaryTensor:a.tensor(0)
                                secondaryTensor:a.tensor(1)
                                           name:a.name(2)]);
     }},
    {"minimumWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g minimumWithPrimaryTensor:a.tensor(0)
                                secondaryTensor:a.tensor(1)
                                           name:a.name(2)]);
     }},
    {"equalWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g equalWithPrimaryTensor:a.tensor(0)
                              secondaryTensor:a.tensor(1)
                                         name:a.name(2)]);
     }},
    {"notEqualWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g notEqualWithPrimaryTensor:a.tensor(0)
                                 secondaryTensor:a.tensor(1)
                                            name:a.name(2)]);
     }},
    {"lessThanWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g lessThanWithPrimaryTensor:a.tensor(0)
                                 secondaryTensor:a.tensor(1)
                                            name:a.name(2)]);
     }},
    {"lessThanOrEqualToWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g lessThanOrEqualToWithPrimaryTensor:a.tensor(0)
                                          secondaryTensor:a.tensor(1)
                                                     name:a.name(2)]);
     }},
    {"greaterThanWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g greaterThanWithPrimaryTensor:a.tensor(0)
                                    secondaryTensor:a.tensor(1)
                                               name:a.name(2)]);
     }},
    {"greaterThanOrEqualToWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g greaterThanOrEqualToWithPrimaryTensor:a.tensor(0)
                                             secondaryTensor:a.tensor(1)
                                                        name:a.name(2)]);
     }},
    {"logicalANDWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g logicalANDWithPrimaryTensor:a.tensor(0)
                                   secondaryTensor:a.tensor(1)
                                              name:a.name(2)]);
     }},
    {"logicalORWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g logicalORWithPrimaryTensor:a.tensor(0)
                                  secondaryTensor:a.tensor(1)
                                             name:a.name(2)]);
     }},
    {"logicalXORWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g logicalXORWithPrimaryTensor:a.tensor(0)
                                   secondaryTensor:a.tensor(1)
                                              name:a.name(2)]);
     }},
    {"maximumWithNaNPropagationWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g maximumWithNaNPropagationWithPrimaryTensor:a.tensor(0)
                                                  secondaryTensor:a.tensor(1)
                                                             name:a.name(2)]);
     }},
    {"minimumWithNaNPropagationWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g minimumWithNaNPropagationWithPrimaryTensor:a.tensor(0)
                                                  secondaryTensor:a.tensor(1)
                                                             name:a.name(2)]);
     }},
    {"bitwiseANDWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g bitwiseANDWithPrimaryTensor:a.tensor(0)
                                   secondaryTensor:a.tensor(1)
                                              name:a.name(2)]);
     }},
    {"bitwiseXORWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g bitwiseXORWithPrimaryTensor:a.tensor(0)
                                   secondaryTensor:a.tensor(1)
                                              name:a.name(2)]);
     }},
    {"bitwiseRightShiftWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g bitwiseRightShiftWithPrimaryTensor:a.tensor(0)
                                          secondaryTensor:a.tensor(1)
                                                     name:a.name(2)]);
     }},
    {"selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g selectWithPredicateTensor:a.tensor(0)
                             truePredicateTensor:a.tensor(1)
                            falsePredicateTensor:a.tensor(2)
                                            name:a.name(3)]);
     }},
    {"clampWithTensor:minValueTensor:maxValueTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g clampWithTensor:a.tensor(0)
                        minValueTensor:a.tensor(1)
                        maxValueTensor:a.tensor(2)
                                  name:a.name(3)]);
     }},
    {"castTensor:toType:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g castTensor:a.tensor(0) toType:a.dtype(1) name:a.name(2)]);
     }},
    {"normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g normalizationWithTensor:a.tensor(0)
                                    meanTensor:a.tensor(1)
                                varianceTensor:a.tensor(2)
                                   gammaTensor:a.tensor(3)
                                    betaTensor:a.tensor(4)
                                       epsilon:a.real_float(5)
                                          name:a.name(6)]);
     }},
    {"matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g matrixMultiplicationWithPrimaryTensor:a.tensor(0)
                                             secondaryTensor:a.tensor(1)
                                                        name:a.name(2)]);
     }},
    {"reductionSumWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionSumWithTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"reductionMaximumWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionMaximumWithTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"reductionMinimumWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionMinimumWithTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"reductionMaximumPropagateNaNWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionMaximumPropagateNaNWithTensor:a.tensor(0)
                                                         axes:a.ints(1)
                                                         name:a.name(2)]);
     }},
    {"reductionMinimumPropagateNaNWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionMinimumPropagateNaNWithTensor:a.tensor(0)
                                                         axes:a.ints(1)
                                                         name:a.name(2)]);
     }},
    {"reductionProductWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionProductWithTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"reductionAndWithTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionAndWithTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"meanOfTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g meanOfTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"varianceOfTensor:axes:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g varianceOfTensor:a.tensor(0) axes:a.ints(1) name:a.name(2)]);
     }},
    {"reductionArgMaximumWithTensor:axis:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionArgMaximumWithTensor:a.tensor(0) axis:a.integer(1) name:a.name(2)]);
     }},
    {"reductionArgMinimumWithTensor:axis:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reductionArgMinimumWithTensor:a.tensor(0) axis:a.integer(1) name:a.name(2)]);
     }},
    {"argSortWithTensor:axis:descending:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g argSortWithTensor:a.tensor(0)
                                   axis:a.integer(1)
                             descending:a.flag(2)
                                   name:a.name(3)]);
     }},
    {"softMaxWithTensor:axis:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g softMaxWithTensor:a.tensor(0) axis:a.integer(1) name:a.name(2)]);
     }},
    {"cumulativeSumWithTensor:axis:exclusive:reverse:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g cumulativeSumWithTensor:a.tensor(0)
                                          axis:a.integer(1)
                                     exclusive:a.flag(2)
                                       reverse:a.flag(3)
                                          name:a.name(4)]);
     }},
    {"reshapeTensor:withShape:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g reshapeTensor:a.tensor(0) withShape:a.shape(1) name:a.name(2)]);
     }},
    {"transposeTensor:dimension:withDimension:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g transposeTensor:a.tensor(0)
                             dimension:a.uinteger(1)
                         withDimension:a.uinteger(2)
                                  name:a.name(3)]);
     }},
    {"transposeTensor:permutation:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g transposeTensor:a.tensor(0) permutation:a.ints(1) name:a.name(2)]);
     }},
    {"broadcastTensor:toShape:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g broadcastTensor:a.tensor(0) toShape:a.shape(1) name:a.name(2)]);
     }},
    {"sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g sliceTensor:a.tensor(0)
                            starts:a.ints(1)
                              ends:a.ints(2)
                           strides:a.ints(3)
                         startMask:a.uint32(4)
                           endMask:a.uint32(5)
                       squeezeMask:a.uint32(6)
                              name:a.name(7)]);
     }},
    {"concatTensors:dimension:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g concatTensors:a.tensors(0) dimension:a.integer(1) name:a.name(2)]);
     }},
    {"stackTensors:axis:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g stackTensors:a.tensors(0) axis:a.integer(1) name:a.name(2)]);
     }},
    {"padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g padTensor:a.tensor(0)
                 withPaddingMode:a.enumeration<MPSGraphPaddingMode>(1)
                     leftPadding:a.shape(2)
                    rightPadding:a.shape(3)
                   constantValue:a.real(4)
                            name:a.name(5)]);
     }},
    {"gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g gatherWithUpdatesTensor:a.tensor(0)
                                 indicesTensor:a.tensor(1)
                                          axis:a.uinteger(2)
                               batchDimensions:a.uinteger(3)
                                          name:a.name(4)]);
     }},
    {"gatherAlongAxis:withUpdatesTensor:indicesTensor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g gatherAlongAxis:a.integer(0)
                     withUpdatesTensor:a.tensor(1)
                         indicesTensor:a.tensor(2)
                                  name:a.name(3)]);
     }},
    {"scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g scatterWithDataTensor:a.tensor(0)
                               updatesTensor:a.tensor(1)
                               indicesTensor:a.tensor(2)
                                        axis:a.integer(3)
                                        mode:a.enumeration<MPSGraphScatterMode>(4)
                                        name:a.name(5)]);
     }},
    {"scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g scatterAlongAxis:a.integer(0)
                         withDataTensor:a.tensor(1)
                          updatesTensor:a.tensor(2)
                          indicesTensor:a.tensor(3)
                                   mode:a.enumeration<MPSGraphScatterMode>(4)
                                   name:a.name(5)]);
     }},
    {"oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g oneHotWithIndicesTensor:a.tensor(0)
                                         depth:a.uinteger(1)
                                          axis:a.uinteger(2)
                                      dataType:a.dtype(3)
                                       onValue:a.real(4)
                                      offValue:a.real(5)
                                          name:a.name(6)]);
     }},
    {"convolution2DWithSourceTensor:weightsTensor:descriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g convolution2DWithSourceTensor:a.tensor(0)
                                       weightsTensor:a.tensor(1)
                                          descriptor:a.convolution2d(2)
                                                name:a.name(3)]);
     }},
    {"convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:"
     "outputShape:forwardConvolutionDescriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g convolution2DDataGradientWithIncomingGradientTensor:a.tensor(0)
                                                             weightsTensor:a.tensor(1)
                                                               outputShape:a.shape(2)
                                              forwardConvolutionDescriptor:a.convolution2d(3)
                                                                      name:a.name(4)]);
     }},
    {"convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:"
     "outputShape:forwardConvolutionDescriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g convolution2DWeightsGradientWithIncomingGradientTensor:a.tensor(0)
                                                                 sourceTensor:a.tensor(1)
                                                                  outputShape:a.shape(2)
                                                 forwardConvolutionDescriptor:a.convolution2d(3)
                                                                         name:a.name(4)]);
     }},
    {"maxPooling2DWithSourceTensor:descriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g maxPooling2DWithSourceTensor:a.tensor(0)
                                         descriptor:a.pooling2d(1)
                                               name:a.name(2)]);
     }},
    {"maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g maxPooling2DGradientWithGradientTensor:a.tensor(0)
                                                 sourceTensor:a.tensor(1)
                                                   descriptor:a.pooling2d(2)
                                                         name:a.name(3)]);
     }},
    {"avgPooling2DWithSourceTensor:descriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g avgPooling2DWithSourceTensor:a.tensor(0)
                                         descriptor:a.pooling2d(1)
                                               name:a.name(2)]);
     }},
    {"avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",
     [](MPSGraph* g, const CallArgs& a) -> Results {
       return a.one([g avgPooling2DGradientWithGradientTensor:a.tensor(0)
                                                 sourceTensor:a.tensor(1)
                                                   descriptor:a.pooling2d(2)
                                                         name:a.name(3)]);
     }},
};
// END REPLAY TABLE

const std::unordered_map<std::string, ReplayFn>& replay_index() {
  static const auto* index = [] {
    auto* map = new std::unordered_map<std::string, ReplayFn>;
    for (const ReplayEntry& entry : kReplayTable) (*map)[entry.selector] = entry.replay;
    return map;
  }();
  return *index;
}

size_t selector_arity(const std::string& selector) {
  size_t colons = 0;
  for (char c : selector) colons += c == ':' ? 1 : 0;
  return colons;
}

struct DataTypeName {
  const char* name;
  MPSDataType type;
};

const DataTypeName kDataTypes[] = {
    {"MPSDataTypeFloat32", MPSDataTypeFloat32}, {"MPSDataTypeFloat16", MPSDataTypeFloat16},
    {"MPSDataTypeBFloat16", MPSDataTypeBFloat16}, {"MPSDataTypeInt8", MPSDataTypeInt8},
    {"MPSDataTypeInt16", MPSDataTypeInt16},     {"MPSDataTypeInt32", MPSDataTypeInt32},
    {"MPSDataTypeInt64", MPSDataTypeInt64},     {"MPSDataTypeUInt8", MPSDataTypeUInt8},
    {"MPSDataTypeUInt16", MPSDataTypeUInt16},   {"MPSDataTypeUInt32", MPSDataTypeUInt32},
    {"MPSDataTypeUInt64", MPSDataTypeUInt64},   {"MPSDataTypeBool", MPSDataTypeBool},
};

}  // namespace

MPSDataType mps_data_type(const std::string& name) {
  for (const DataTypeName& entry : kDataTypes) {
    if (name == entry.name) return entry.type;
  }
  throw std::invalid_argument("unknown MPSDataType '" + name + "'");
}

std::string mps_data_type_name(MPSDataType type) {
  for (const DataTypeName& entry : kDataTypes) {
    if (type == entry.type) return entry.name;
  }
  throw std::invalid_argument("MPSDataType " + std::to_string(static_cast<uint32_t>(type)) +
                              " is not one the backend uses");
}

std::vector<std::string> replay_selectors() {
  std::vector<std::string> out;
  for (const ReplayEntry& entry : kReplayTable) out.emplace_back(entry.selector);
  return out;
}

namespace {

// Runs one recorded call through its table entry and defines its results.
void replay_call(MPSGraph* graph, const Call& call, size_t index,
                 std::unordered_map<int64_t, MPSGraphTensor*>& tensors) {
  const auto& table = replay_index();
  auto it = table.find(call.selector);
  if (it == table.end()) {
    throw std::invalid_argument(describe_call(call, index) +
                                ": no replay entry for this selector (not in the selector table)");
  }
  if (call.args.size() != selector_arity(call.selector)) {
    throw std::invalid_argument(describe_call(call, index) + ": " +
                                std::to_string(call.args.size()) +
                                " arguments, the selector takes " +
                                std::to_string(selector_arity(call.selector)));
  }
  CallArgs args(call, index, tensors);
  Results results = nil;
  @try {
    results = it->second(graph, args);
  } @catch (NSException* e) {
    throw std::runtime_error(describe_call(call, index) + ": MPSGraph raised " +
                             std::string(e.name ? e.name.UTF8String : "NSException") + ": " +
                             std::string(e.reason ? e.reason.UTF8String : ""));
  }
  if (results.count != call.results.size()) {
    throw std::invalid_argument(describe_call(call, index) + ": returns " +
                                std::to_string(results.count) + " tensors, the program names " +
                                std::to_string(call.results.size()));
  }
  for (size_t r = 0; r < call.results.size(); ++r) {
    if (tensors.count(call.results[r])) {
      throw std::invalid_argument(describe_call(call, index) + ": tensor id " +
                                  std::to_string(call.results[r]) + " is already defined");
    }
    tensors[call.results[r]] = results[r];
  }
}

}  // namespace

ReplayedGraph replay(const Program& program) {
  ReplayedGraph out;
  out.graph = [MPSGraph new];
  std::unordered_map<int64_t, MPSGraphTensor*> tensors;
  // Placeholders are placeholderWithShape:dataType:name: calls like any other (their table entry).
  for (size_t i = 0; i < program.placeholders.size(); ++i) {
    const Placeholder& p = program.placeholders[i];
    for (int64_t dim : p.shape) {
      if (dim < -1) {
        throw std::invalid_argument("placeholder " + std::to_string(p.id) + " has dimension " +
                                    std::to_string(dim) + " (only -1 or sizes >= 0)");
      }
    }
    Call call;
    call.selector = "placeholderWithShape:dataType:name:";
    call.args.resize(3);
    call.args[0].kind = ArgKind::Shape;
    call.args[0].ints = p.shape;
    call.args[1].kind = ArgKind::DType;
    call.args[1].name = p.dtype;
    call.args[2].kind = ArgKind::NilObject;
    call.results = {p.id};
    replay_call(out.graph, call, i, tensors);
    out.placeholders.push_back(tensors[p.id]);
  }
  for (size_t i = 0; i < program.calls.size(); ++i) {
    replay_call(out.graph, program.calls[i], i, tensors);
  }
  NSMutableArray<MPSGraphTensor*>* targets =
      [NSMutableArray arrayWithCapacity:program.targets.size()];
  for (int64_t id : program.targets) {
    auto it = tensors.find(id);
    if (it == tensors.end()) {
      throw std::invalid_argument("target tensor " + std::to_string(id) + " is never defined");
    }
    [targets addObject:it->second];
  }
  out.targets = targets;
  return out;
}

}  // namespace lucid::mpsgraph
