// core/src/util/version_text.hpp: the one version_string. The CUDA and HIP backends print runtime
// versions with it, so the encodings are checked here, where no GPU toolkit is needed.
#include <gtest/gtest.h>

#include "util/version_text.hpp"

namespace {

using kvoffload::util::cuda_version_string;
using kvoffload::util::hip_version_string;
using kvoffload::util::version_string;

TEST(VersionString, CudaEncodingIsMajorTimes1000PlusMinorTimes10) {
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(11080), "11.8");
}

TEST(VersionString, HipEncodingIsMajorTimes1e7PlusMinorTimes1e5PlusPatch) {
  EXPECT_EQ(hip_version_string(70151234), "7.1");
  EXPECT_EQ(hip_version_string(50222912), "5.2");
  EXPECT_EQ(hip_version_string(61500000), "6.15");
}

TEST(VersionString, GenericUnits) {
  EXPECT_EQ(version_string(30207, 10000, 100), "3.2");
}

}  // namespace
