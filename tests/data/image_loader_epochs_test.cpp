// lamp::data::ImageLoader from one epoch to the next: the batches it
// prepares ahead for the next epoch (prefetch_next_epoch) are those a fresh
// start there gives, and any other position starts afresh.

#include <lamp/data.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "data/image_loader_fixture.h"
#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace image_loader_epochs_test {

namespace {

using lamp::data::ImageBatch;
using lamp::data::ImageFolder;
using lamp::data::ImageLoader;
using lamp::data::ImageLoaderOptions;

class ImageLoaderEpochsTest : public image_loader_fixture::ImageLoaderFixture {
 protected:
  // The batches from batch `from` of `epoch` to its end, by a loader made
  // for them.
  static std::vector<ImageBatch> fresh(
      const ImageFolder& folder,
      const ImageLoaderOptions& options,
      int64_t epoch,
      int64_t from = 0) {
    ImageLoader loader(folder, options);
    loader.seek(epoch, from);
    std::vector<ImageBatch> batches;
    while (auto b = loader.next()) {
      batches.push_back(std::move(*b));
    }
    return batches;
  }
  static void expect_same(
      const std::vector<ImageBatch>& got,
      const std::vector<ImageBatch>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].epoch, want[k].epoch) << k;
      EXPECT_EQ(got[k].index, want[k].index) << k;
      EXPECT_TRUE(torch::equal(got[k].images, want[k].images)) << k;
      EXPECT_TRUE(torch::equal(got[k].targets, want[k].targets)) << k;
    }
  }
};

TEST_F(ImageLoaderEpochsTest, TheNextEpochPreparedAheadEqualsAFreshStart) {
  const auto root = make_folder("data", 3, 8, 40, 5);
  ImageFolder folder(root);
  // 24 images in batches of 5: four of 5 and one of 4; a ring (prefetch + 1)
  // of 7 slots holds more than an epoch, so the look-ahead reaches two
  // epochs ahead.
  const auto options = ImageLoaderOptions()
                           .batch_size(5)
                           .image_size(16)
                           .seed(11)
                           .num_threads(3)
                           .prefetch(6);
  ImageLoader loader(folder, options);
  for (int64_t epoch : {0, 1, 2}) {
    const auto got = epoch_of(loader, epoch);
    ASSERT_EQ(got.size(), 5u) << epoch;
    EXPECT_EQ(got.back().images.size(0), 4);
    expect_same(got, fresh(folder, options, epoch));
    // The end stays the end until the loader is moved.
    EXPECT_FALSE(loader.next().has_value());
    EXPECT_EQ(loader.epoch(), epoch);
    EXPECT_EQ(loader.batch(), 5);
  }
  // From the end of epoch 2: another epoch, another position in the next
  // one, and the same epoch again all start afresh.
  expect_same(epoch_of(loader, 5), fresh(folder, options, 5));
  loader.seek(6, 2);
  std::vector<ImageBatch> rest;
  while (auto b = loader.next()) {
    rest.push_back(std::move(*b));
  }
  expect_same(rest, fresh(folder, options, 6, 2));
  expect_same(epoch_of(loader, 6), fresh(folder, options, 6));
  // Without the look-ahead: the same batches.
  ImageLoader within(
      folder, ImageLoaderOptions(options).prefetch_next_epoch(false));
  for (int64_t epoch : {0, 1}) {
    expect_same(epoch_of(within, epoch), fresh(folder, options, epoch));
  }
}

// Bad files counted per epoch (each epoch's own, when delivered) while the
// next epoch is decoded ahead; a bad file without skip_bad_images is an
// error when its batch is asked for, not before.
TEST_F(ImageLoaderEpochsTest, BadFilesAheadBelongToTheirEpoch) {
  const auto root = dir_ + "/data";
  const auto bad = make_bad_folder(root);
  ImageFolder folder(root);
  auto options = ImageLoaderOptions()
                     .batch_size(4)
                     .image_size(16)
                     .num_threads(2)
                     .prefetch(8)
                     .skip_bad_images(true);
  ImageLoader loader(folder, options);
  for (int64_t epoch : {0, 1, 2}) {
    EXPECT_EQ(images_of(loader, epoch), 16) << epoch;
    EXPECT_EQ(sorted(loader.skipped_paths()), sorted(bad)) << epoch;
  }
  // In order, only batch 2 (class_00's img_0008, img_0009 and class_01's
  // img_0000, img_0001) has no bad file: the bad ones prepared ahead of it
  // wait for their batches.
  ImageLoader strict(
      folder,
      ImageLoaderOptions(options).shuffle(false).skip_bad_images(false));
  strict.seek(0, 2);
  const auto good = strict.next();
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->images.size(0), 4);
  lamp::test::expect_error([&] { strict.next(); }, bad[2]);
}

} // namespace

} // namespace image_loader_epochs_test
