// SPDX-License-Identifier: Apache-2.0
// The trainer <-> agent framing (common/framing.h): a 4-byte big-endian length, then
// the message; bounded, and never crashing on a broken stream.
#include "common/framing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "regroup/v1/wire.pb.h"

namespace regroup {
namespace {

namespace v1 = regroup::v1;

class SocketPair : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    CloseWriter();
    close(fds_[0]);
  }
  void CloseWriter() {
    if (fds_[1] >= 0) close(fds_[1]);
    fds_[1] = -1;
  }
  void WriteRaw(const std::string& bytes) {
    ASSERT_EQ(write(fds_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  int reader() const { return fds_[0]; }
  int writer() const { return fds_[1]; }

 private:
  int fds_[2] = {-1, -1};
};

v1::TrainerMessage Vote(int64_t step) {
  v1::TrainerMessage m;
  m.mutable_vote()->set_generation(3);
  m.mutable_vote()->set_step(step);
  m.mutable_vote()->set_ok(true);
  m.mutable_vote()->set_checksum(0xdeadbeefcafeULL);
  return m;
}

TEST(EncodeFrame, StartsWithTheBigEndianPayloadLength) {
  v1::TrainerMessage m;
  m.mutable_fault()->set_detail(std::string(300, 'x'));
  const std::string frame = EncodeFrame(m);
  const size_t size = m.ByteSizeLong();
  ASSERT_EQ(frame.size(), 4 + size);
  EXPECT_EQ(static_cast<unsigned char>(frame[0]), 0);
  EXPECT_EQ(static_cast<unsigned char>(frame[1]), 0);
  EXPECT_EQ(static_cast<unsigned char>(frame[2]), (size >> 8) & 0xff);
  EXPECT_EQ(static_cast<unsigned char>(frame[3]), size & 0xff);
}

TEST_F(SocketPair, FramesRoundTripInOrder) {
  ASSERT_TRUE(WriteFrame(writer(), Vote(1)).ok());
  ASSERT_TRUE(WriteFrame(writer(), v1::TrainerMessage()).ok());  // an empty message: length 0
  ASSERT_TRUE(WriteFrame(writer(), Vote(2)).ok());
  CloseWriter();
  std::string payload;
  v1::TrainerMessage got;
  ASSERT_TRUE(*ReadFrame(reader(), &payload));
  ASSERT_TRUE(ParseFrame(payload, &got, "TrainerMessage").ok());
  EXPECT_EQ(got.vote().step(), 1);
  EXPECT_EQ(got.vote().checksum(), 0xdeadbeefcafeULL);
  ASSERT_TRUE(*ReadFrame(reader(), &payload));
  EXPECT_TRUE(payload.empty());
  ASSERT_TRUE(*ReadFrame(reader(), &payload));
  ASSERT_TRUE(ParseFrame(payload, &got, "TrainerMessage").ok());
  EXPECT_EQ(got.vote().step(), 2);
  auto end = ReadFrame(reader(), &payload);
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(*end);  // a clean end of stream between frames
}

TEST_F(SocketPair, AFrameOverTheBoundIsRefusedWithoutReadingIt) {
  WriteRaw(std::string("\x01\x00\x00\x01", 4));  // 16 MiB + 1
  std::string payload;
  auto got = ReadFrame(reader(), &payload);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), REGROUP_RESOURCE_EXHAUSTED);
  EXPECT_NE(got.status().message().find("16777217"), std::string::npos)
      << got.status().message();
  EXPECT_TRUE(payload.empty());
}

TEST_F(SocketPair, AFrameAtTheBoundIsAccepted) {
  v1::TrainerMessage m;
  m.mutable_fault()->set_detail(std::string(1000, 'y'));
  ASSERT_TRUE(WriteFrame(writer(), m).ok());
  std::string payload;
  auto got = ReadFrame(reader(), &payload, m.ByteSizeLong());
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(*got);
}

TEST_F(SocketPair, AStreamEndingInsideAFrameIsAnError) {
  WriteRaw(std::string("\x00\x00\x00\x0a", 4) + "12345");  // announces 10, sends 5
  CloseWriter();
  std::string payload;
  auto got = ReadFrame(reader(), &payload);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(got.status().message().find("5 of 10"), std::string::npos) << got.status().message();
}

TEST_F(SocketPair, AStreamEndingInsideAHeaderIsAnError) {
  WriteRaw(std::string("\x00\x00", 2));
  CloseWriter();
  std::string payload;
  auto got = ReadFrame(reader(), &payload);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("header"), std::string::npos) << got.status().message();
}

TEST(ParseFrame, GarbageIsAnErrorNotACrash) {
  v1::TrainerMessage m;
  Status s = ParseFrame(std::string("\xff\xff\xff\xff\xff", 5), &m, "TrainerMessage");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a valid TrainerMessage"), std::string::npos) << s.message();
}

TEST(FrameReader, SplitsFramesFedOneByteAtATime) {
  const std::string stream = EncodeFrame(Vote(7)) + EncodeFrame(Vote(8));
  FrameReader reader;
  std::vector<int64_t> steps;
  std::string payload;
  for (char c : stream) {
    reader.Append(&c, 1);
    while (reader.Next(&payload) == FrameReader::Result::kFrame) {
      v1::TrainerMessage m;
      ASSERT_TRUE(m.ParseFromString(payload));
      steps.push_back(m.vote().step());
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(FrameReader, StaysRefusedAfterAnOversizeHeader) {
  FrameReader reader(100);
  const std::string header("\x00\x00\x00\x65", 4);  // 101
  reader.Append(header.data(), header.size());
  std::string payload;
  EXPECT_EQ(reader.Next(&payload), FrameReader::Result::kTooLarge);
  EXPECT_EQ(reader.refused_length(), 101u);
  const std::string more = EncodeFrame(Vote(1));
  reader.Append(more.data(), more.size());
  EXPECT_EQ(reader.Next(&payload), FrameReader::Result::kTooLarge);
}

}  // namespace
}  // namespace regroup
