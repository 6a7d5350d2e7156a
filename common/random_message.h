// SPDX-License-Identifier: Apache-2.0
// Random protobuf messages, for the tests that play hostile clients through a real server: every
// field of every type filled at random through reflection (the extremes of each integer type
// often, enum values the schema does not name, strings now and then of 64 KiB), one member of
// each oneof (or none), repeated fields of 0 to 4 elements, nested messages three deep; and now
// and then the wire bytes of such a message with some bytes flipped, when they still parse.
// Deterministic for a seed.
#ifndef REGROUP_COMMON_RANDOM_MESSAGE_H_
#define REGROUP_COMMON_RANDOM_MESSAGE_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/common.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>

namespace regroup {

// The first seed of a test's random clients: REGROUP_HOSTILE_SEED, to explore seeds beyond the
// fixed ones a test runs by default (base 0).
inline uint64_t HostileSeedBase() {
  const char* s = std::getenv("REGROUP_HOSTILE_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 0;
}

class RandomMessages {
 public:
  explicit RandomMessages(uint64_t seed) : rng_(seed) {}

  template <typename M>
  M Make() {
    M m;
    Fill(m, 0);
    if (OneIn(4)) Mangle(m);
    return m;
  }

  bool OneIn(uint64_t n) { return rng_() % n == 0; }
  uint64_t Below(uint64_t n) { return rng_() % n; }

  // An integer of type T: an extreme, a small one, or any.
  template <typename T>
  T Int() {
    switch (Below(6)) {
      case 0: return std::numeric_limits<T>::max();
      case 1: return std::numeric_limits<T>::min();
      case 2: return static_cast<T>(Below(4));
      case 3: return static_cast<T>(-1);
      case 4: return static_cast<T>(Below(100));
      default: return static_cast<T>(rng_());
    }
  }

  // Mostly printable text of up to 300 bytes, sometimes 64 KiB, sometimes any bytes (not UTF-8).
  std::string Text() {
    const size_t n = OneIn(20) ? size_t{64} << 10 : Below(300);
    std::string s(n, ' ');
    const bool raw = OneIn(50);
    for (char& c : s) c = static_cast<char>(raw ? Below(256) : 32 + Below(95));
    return s;
  }

  void Fill(google::protobuf::Message& m, int depth) {
    const auto* d = m.GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const auto* f = d->field(i);
      if (f->containing_oneof() || OneIn(3)) continue;
      if (f->is_repeated()) {
        for (uint64_t n = Below(5); n > 0; --n) Set(m, f, depth, /*add=*/true);
      } else {
        Set(m, f, depth, /*add=*/false);
      }
    }
    for (int i = 0; i < d->oneof_decl_count(); ++i) {
      const auto* o = d->oneof_decl(i);
      if (OneIn(8)) continue;
      Set(m, o->field(static_cast<int>(Below(static_cast<uint64_t>(o->field_count())))), depth,
          false);
    }
  }

  // Flips 1 to 8 bytes of the message's wire form; keeps the result if it parses.
  void Mangle(google::protobuf::Message& m) {
    std::string wire = m.SerializePartialAsString();
    if (wire.empty()) return;
    for (uint64_t n = 1 + Below(8); n > 0; --n)
      wire[Below(wire.size())] = static_cast<char>(Below(256));
    std::unique_ptr<google::protobuf::Message> parsed(m.New());
    if (parsed->ParsePartialFromString(wire)) m.CopyFrom(*parsed);
  }

 private:
  void Set(google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f, int depth,
           bool add) {
    using F = google::protobuf::FieldDescriptor;
    const auto* r = m.GetReflection();
    switch (f->cpp_type()) {
      case F::CPPTYPE_INT32:
        add ? r->AddInt32(&m, f, Int<int32_t>()) : r->SetInt32(&m, f, Int<int32_t>());
        break;
      case F::CPPTYPE_INT64:
        add ? r->AddInt64(&m, f, Int<int64_t>()) : r->SetInt64(&m, f, Int<int64_t>());
        break;
      case F::CPPTYPE_UINT32:
        add ? r->AddUInt32(&m, f, Int<uint32_t>()) : r->SetUInt32(&m, f, Int<uint32_t>());
        break;
      case F::CPPTYPE_UINT64:
        add ? r->AddUInt64(&m, f, Int<uint64_t>()) : r->SetUInt64(&m, f, Int<uint64_t>());
        break;
      case F::CPPTYPE_DOUBLE: {
        const double v = OneIn(4) ? std::numeric_limits<double>::infinity()
                                  : static_cast<double>(Int<int64_t>());
        add ? r->AddDouble(&m, f, v) : r->SetDouble(&m, f, v);
        break;
      }
      case F::CPPTYPE_FLOAT: {
        const float v = static_cast<float>(Int<int32_t>());
        add ? r->AddFloat(&m, f, v) : r->SetFloat(&m, f, v);
        break;
      }
      case F::CPPTYPE_BOOL:
        add ? r->AddBool(&m, f, OneIn(2)) : r->SetBool(&m, f, OneIn(2));
        break;
      case F::CPPTYPE_ENUM: {
        // A value the schema names, or one it does not (proto3 enums are open).
        const auto* e = f->enum_type();
        const int v = OneIn(4) ? static_cast<int>(Below(1000)) - 500
                               : e->value(static_cast<int>(Below(
                                     static_cast<uint64_t>(e->value_count()))))->number();
        add ? r->AddEnumValue(&m, f, v) : r->SetEnumValue(&m, f, v);
        break;
      }
      case F::CPPTYPE_STRING:
        add ? r->AddString(&m, f, Text()) : r->SetString(&m, f, Text());
        break;
      case F::CPPTYPE_MESSAGE:
        if (depth >= 3) return;
        Fill(add ? *r->AddMessage(&m, f) : *r->MutableMessage(&m, f), depth + 1);
        break;
    }
  }

  std::mt19937_64 rng_;
};

// While alive, protobuf's own log lines (one for every string of bad UTF-8 it parses or
// serializes, which random messages are full of) are not written. Protobuf 22 and later log
// through Abseil, and keep logging.
class ProtobufQuiet {
#if GOOGLE_PROTOBUF_VERSION < 4022000
  google::protobuf::LogSilencer silencer_;
#endif
};

}  // namespace regroup

#endif  // REGROUP_COMMON_RANDOM_MESSAGE_H_
