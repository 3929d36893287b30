// The data-only pickle reader: what Python's pickle and PyTorch's jit pickler write is read; what
// would look up, construct or call anything is refused with its byte offset; memo references that
// nest forever or expand beyond the input's size are refused instead of followed.
#include "megascope/analyzer/pickle.h"

#include <gtest/gtest.h>

#include <string>

namespace megascope::analyzer {
namespace {

using nlohmann::json;
using namespace std::string_literals;

// pickle.dumps(VALUE, protocol=N) from CPython 3, for
// {"a": [1, -2, 3.5, None, True, "x"], "b": ("t", 300, 70000, 2**40, -2**63), "c": {"3": False},
//  7: "int key"}
const json kValue = {{"a", {1, -2, 3.5, nullptr, true, "x"}},
                     {"b", {"t", 300, 70000, int64_t{1} << 40, INT64_MIN}},
                     {"c", {{"3", false}}},
                     {"7", "int key"}};
const std::string kProtocol0 =
    "(dp0\nVa\np1\n(lp2\nI1\naI-2\naF3.5\naNaI01\naVx\np3\nasVb\np4\n("
    "Vt\np5\nI300\nI70000\nL1099511627776L\nL-9223372036854775808L\ntp6\nsVc\np7\n("
    "dp8\nV3\np9\nI00\nssI7\nVint key\np10\ns.";
const std::string kProtocol2(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe"
    "\xff\xff\xff\x47\x40\x0c\x00\x00\x00\x00\x00\x00\x4e\x88\x58\x01\x00\x00\x00\x78\x71\x03"
    "\x65\x58\x01\x00\x00\x00\x62\x71\x04\x28\x58\x01\x00\x00\x00\x74\x71\x05\x4d\x2c\x01\x4a"
    "\x70\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
    "\x74\x71\x06\x58\x01\x00\x00\x00\x63\x71\x07\x7d\x71\x08\x58\x01\x00\x00\x00\x33\x71\x09"
    "\x89\x73\x4b\x07\x58\x07\x00\x00\x00\x69\x6e\x74\x20\x6b\x65\x79\x71\x0a\x75\x2e",
    130);
const std::string kProtocol5(
    "\x80\x05\x95\x60\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x4b"
    "\x01\x4a\xfe\xff\xff\xff\x47\x40\x0c\x00\x00\x00\x00\x00\x00\x4e\x88\x8c\x01\x78\x94\x65"
    "\x8c\x01\x62\x94\x28\x8c\x01\x74\x94\x4d\x2c\x01\x4a\x70\x11\x01\x00\x8a\x06\x00\x00\x00"
    "\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x74\x94\x8c\x01\x63\x94\x7d\x94\x8c"
    "\x01\x33\x94\x89\x73\x4b\x07\x8c\x07\x69\x6e\x74\x20\x6b\x65\x79\x94\x75\x2e",
    107);

TEST(PickleTest, ReadsWhatPythonWritesInProtocolsZeroTwoAndFive) {
  for (const std::string* bytes : {&kProtocol0, &kProtocol2, &kProtocol5}) {
    auto v = ReadPickle(*bytes);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, kValue) << v->dump();
  }
  EXPECT_FALSE(LooksLikePickle(kProtocol0));  // protocol 0 has no PROTO opcode
  EXPECT_TRUE(LooksLikePickle(kProtocol2));
  EXPECT_TRUE(LooksLikePickle(kProtocol5));
  EXPECT_FALSE(LooksLikePickle("{\"version\": \"2.4\"}"));
}

// torch::jit::pickle wraps every dict and list: restore_type_tag(value, "Dict[Any, Any]").
TEST(PickleTest, ReadsTorchScriptsTagsAndTypedListsAsTheirValues) {
  const std::string tagged =
      "\x80\x02"
      "ctorch.jit._pickle\nrestore_type_tag\nq\x00"
      "}(X\x01\x00\x00\x00"
      "kq\x01"
      "ctorch.jit._pickle\nbuild_intlist\nq\x02(](K\x01K\x02"
      "etRuX\x0e\x00\x00\x00"
      "Dict[Any, Any]q\x03\x86R."s;
  auto v = ReadPickle(tagged);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (json{{"k", {1, 2}}}));
}

TEST(PickleTest, RefusesEverythingThatWouldCallOrConstruct) {
  const std::pair<std::string, std::string> cases[] = {
      {"cos\nsystem\n(S'echo owned'\ntR."s, "byte 0: global 'os.system' would be looked up"},
      {"\x80\x02X\x01\x00\x00\x00"
       "a\x8c\x01"
       "b\x93."s,
       "byte 11: global 'a.b'"},
      {"\x80\x02}(X\x01\x00\x00\x00"
       "aK\x01ub."s,
       "byte 13: opcode BUILD"},
      {"\x80\x02)\x81."s, "byte 3: opcode NEWOBJ"},
      {"(i__main__\nX\n."s, "byte 1: opcode INST"},
      {"\x80\x02X\x01\x00\x00\x00"
       "aQ."s,
       "byte 8: opcode BINPERSID"},
      {"\x80\x02K\x01"s, "without its STOP opcode"},
      {"\x80\x02X\xff\x00\x00\x00"
       "ab."s,
       "byte 2: string runs past the end"},
      {"\x80\x02h\x05."s, "byte 2: memo 5 was never stored"},
      {"\x80\x06N."s, "pickle protocol 6 is newer than this reader"},
      {"\x80\x02\xff."s, "unknown opcode 0xff"},
  };
  for (const auto& [bytes, want] : cases) {
    auto v = ReadPickle(bytes);
    ASSERT_FALSE(v.ok()) << want;
    EXPECT_NE(v.status().message().find(want), std::string::npos) << v.status().message();
  }
}

TEST(PickleTest, SelfReferenceAndExponentialExpansionAreRefused) {
  // l = []; l.append(l)
  auto self = ReadPickle(
      "\x80\x02]q\x00h\x00"
      "a."s);
  ASSERT_FALSE(self.ok());
  EXPECT_NE(self.status().message().find("nests deeper than 100"), std::string::npos);
  // l0 = [1]; l(k) = [l(k-1), l(k-1)]: 2^40 leaves from 300 bytes.
  std::string laughs =
      "\x80\x02]q\x00K\x01"
      "a"s;
  for (int k = 1; k < 40; ++k) {
    laughs += std::string("]q") + static_cast<char>(k) + "(h" + static_cast<char>(k - 1) + "h" +
              static_cast<char>(k - 1) + "e";
  }
  laughs += ".";
  auto big = ReadPickle(laughs);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("expands to far more data than its size"),
            std::string::npos);
}

}  // namespace
}  // namespace megascope::analyzer
