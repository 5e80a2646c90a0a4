// engine/kernel_timeline.h: names, grouping by step marks and the exposed-time attribution on
// synthetic spans whose answer is worked out by hand.
#include "engine/kernel_timeline.h"

#include <gtest/gtest.h>

namespace sala {
namespace {

TEST(KernelTimeline, ShortNames) {
  EXPECT_EQ(kernel_short_name("void sala::cuda::(anonymous namespace)::qgemv_kernel<1, 1, 2>(sala::cuda::QGemvSet, int)"),
            "qgemv_kernel");
  EXPECT_EQ(kernel_short_name("void sala::cuda::rmsnorm_kernel(const float*, int)"), "rmsnorm_kernel");
  EXPECT_EQ(kernel_short_name("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
}

TEST(KernelTimeline, ExposedTimeAddsUpToTheDeviceSpan) {
  // Steps marked at 50 and 1000 ns (spans listed out of order; "early" starts before the first mark).
  // Step 1: A [100, 400] exposes 300; B [300, 500] overlaps A's tail and exposes 100; C [600, 650]
  // after an idle gap exposes 150 (from the frontier at 500). Step 2: A [1050, 1300] exposes 250,
  // B [1100, 1200] lies under A and exposes 0.
  const std::vector<KernelSpan> spans = {
      {"void ns::a<2>(int)", 1050, 1300, 8}, {"void ns::b(int)", 300, 500, 1},   {"void ns::early(int)", 10, 20, 1},
      {"void ns::a<1>(int)", 100, 400, 8},   {"void ns::c(int)", 600, 650, 1},   {"void ns::b(int)", 1100, 1200, 1},
  };
  const KernelTimeline t = kernel_timeline(spans, {50, 1000});
  ASSERT_EQ(t.steps, 2);
  // Step 1: 550 ns device (100 → 650), gap 50 (mark 50 → 100); step 2: 250 ns, gap 50.
  EXPECT_DOUBLE_EQ(t.device_us, (0.550 + 0.250) / 2);
  EXPECT_DOUBLE_EQ(t.host_gap_us, 0.050);
  double sum = 0;
  for (const KernelFamilyTime& f : t.families) sum += f.exposed_us;
  EXPECT_DOUBLE_EQ(sum, t.device_us);
  ASSERT_EQ(t.families.size(), 3u);  // "early" started before the first mark: not counted
  EXPECT_EQ(t.families[0].family, "a [8]");  // 300 + 250 ns over 2 steps
  EXPECT_DOUBLE_EQ(t.families[0].exposed_us, 0.275);
  EXPECT_DOUBLE_EQ(t.families[0].launches, 1);
  EXPECT_DOUBLE_EQ(t.families[0].span_us, 0.275);
  EXPECT_EQ(t.families[1].family, "c [1]");  // 150 ns in step 1
  EXPECT_DOUBLE_EQ(t.families[1].exposed_us, 0.075);
  EXPECT_EQ(t.families[2].family, "b [1]");  // 100 ns in step 1, 0 in step 2
  EXPECT_DOUBLE_EQ(t.families[2].exposed_us, 0.050);
  EXPECT_DOUBLE_EQ(t.families[2].span_us, 0.150);
  const std::string table = format_kernel_timeline(t);
  EXPECT_NE(table.find("a [8]"), std::string::npos);
  EXPECT_NE(table.find("2 steps"), std::string::npos);
}

TEST(KernelTimeline, SpansAsCsv) {
  // The spans of ExposedTimeAddsUpToTheDeviceSpan, launch by launch (µs from each step's first start).
  const std::vector<KernelSpan> spans = {
      {"void ns::a<2>(int)", 1050, 1300, 8}, {"void ns::b(int)", 300, 500, 1},   {"void ns::early(int)", 10, 20, 1},
      {"void ns::a<1>(int)", 100, 400, 8},   {"void ns::c(int)", 600, 650, 1},   {"void ns::b(int)", 1100, 1200, 1},
  };
  EXPECT_EQ(kernel_spans_csv(spans, {50, 1000}, 3),
            "3,0,0,a,8,0.000,0.300,0.300\n"
            "3,0,1,b,1,0.200,0.400,0.100\n"
            "3,0,2,c,1,0.500,0.550,0.150\n"
            "3,1,0,a,8,0.000,0.250,0.250\n"
            "3,1,1,b,1,0.050,0.150,0.000\n");
  EXPECT_EQ(kernel_spans_csv(spans, {}, 0), "");
}

TEST(KernelTimeline, NoMarksOrNoKernels) {
  EXPECT_EQ(kernel_timeline({{"k", 1, 2, 1}}, {}).steps, 0);
  EXPECT_EQ(kernel_timeline({{"k", 1, 2, 1}}, {5}).steps, 0);  // the only kernel is before the mark
}

}  // namespace
}  // namespace sala
