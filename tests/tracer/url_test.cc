// Percent-encoding, the tree's one (the ClickHouse client's queries and credentials, the agents'
// /query parameters): what goes out reads back as it was, whatever the bytes.
#include <gtest/gtest.h>

#include <string>

#include "megascope/tracer/http_client.h"

namespace megascope::tracer {
namespace {

TEST(UrlTest, PercentEncodingRoundTripsEveryByteAndLeavesTheUnreservedAlone) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string encoded = PercentEncode(all);
  EXPECT_EQ(encoded.find_first_not_of(
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~%"),
            std::string::npos);
  EXPECT_EQ(PercentDecode(encoded), all);
  EXPECT_EQ(PercentDecode(encoded, /*plus_is_space=*/true), all) << "'+' goes out as %2B";
  EXPECT_EQ(PercentEncode("SELECT a+b FROM t"), "SELECT%20a%2Bb%20FROM%20t");
  EXPECT_EQ(PercentEncode("p@ss:w/rd~"), "p%40ss%3Aw%2Frd~");
}

TEST(UrlTest, DecodingKeepsWhatIsNotAnEscapeAndReadsPlusAsSpaceOnlyInAQuery) {
  EXPECT_EQ(PercentDecode("a+b"), "a+b");
  EXPECT_EQ(PercentDecode("a+b", /*plus_is_space=*/true), "a b");
  EXPECT_EQ(PercentDecode("100%"), "100%");
  EXPECT_EQ(PercentDecode("%zz%4"), "%zz%4");
  EXPECT_EQ(PercentDecode("%4g1"), "%4g1") << "two hex digits or it is no escape";
  EXPECT_EQ(PercentDecode("%41%62c"), "Abc");
}

}  // namespace
}  // namespace megascope::tracer
