// SPDX-License-Identifier: Apache-2.0
// A credential that was asked for is either loaded or refused with a reason; a bad path never
// turns authentication off.
#include "common/credential.h"
#include "common/job_token.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

namespace regroup {
namespace {

class CredentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("REGROUP_CREDENTIAL_FILE");
    ::unsetenv("REGROUP_CREDENTIAL");
    dir_ = std::filesystem::temp_directory_path() /
           ("regroup-credential-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    auto path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

TEST_F(CredentialTest, AFileIsReadWithItsTrailingNewlineRemoved) {
  auto token = LoadCredential(Write("token", "s3cret\n"));
  ASSERT_TRUE(token.ok()) << token.status().message();
  EXPECT_EQ(*token, "s3cret");
}

TEST_F(CredentialTest, AnEmptyFileIsAnErrorNotAnOpenServer) {
  auto path = Write("token", " \n");
  auto token = LoadCredential(path);
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.status().message().find("is empty"), std::string::npos) << token.status().message();
  EXPECT_NE(token.status().message().find(path), std::string::npos);
}

TEST_F(CredentialTest, ASecretsMountFolderIsAnErrorThatNamesTheFileToGive) {
  auto token = LoadCredential(dir_.string());
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.status().message().find("is a directory"), std::string::npos)
      << token.status().message();
  EXPECT_NE(token.status().message().find(dir_.string() + "/token"), std::string::npos);
}

TEST_F(CredentialTest, AMissingFileIsAnError) {
  EXPECT_FALSE(LoadCredential((dir_ / "absent").string()).ok());
}

TEST_F(CredentialTest, AHugeFileIsRefused) {
  auto token = LoadCredential(Write("token", std::string(2 << 20, 'x')));
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.status().message().find("more than"), std::string::npos) << token.status().message();
}

TEST_F(CredentialTest, TheFileNamedByTheEnvironmentIsCheckedTheSameWay) {
  ::setenv("REGROUP_CREDENTIAL_FILE", Write("token", "").c_str(), 1);
  EXPECT_FALSE(LoadCredential("").ok());
  ::unsetenv("REGROUP_CREDENTIAL_FILE");
}

TEST_F(CredentialTest, NoneConfiguredIsEmpty) {
  auto token = LoadCredential("");
  ASSERT_TRUE(token.ok());
  EXPECT_TRUE(token->empty());
}

}  // namespace
}  // namespace regroup

// The job's token and the epoch's ticket are HMAC-SHA256 over the messages job_token.h states;
// the expected values are openssl's: printf 'regroup-job-v1\0team-a/victim\0c0ffee-uid' |
// openssl dgst -sha256 -hmac k3y (the ticket: printf '%s\0%s\0%s\0%s' regroup-epoch-v1
// team-a/victim c0ffee-uid 42 | ...).
TEST(JobToken, IsTheHmacOfTheJobsIdAndUidUnderTheClusterKey) {
  EXPECT_EQ(regroup::JobToken("k3y", "team-a/victim", "c0ffee-uid"),
            "29ae38b9ef0a12788d74ee08b95e28360fab9489bc2541d3e198e0da941ffd3d");
  EXPECT_EQ(regroup::EpochTicket("k3y", "team-a/victim", "c0ffee-uid", 42),
            "da5ebd3e8a6f284836718c7711ff300e8ba562efedab8663ae5a15e9fa61271a");
  // Bound to each part: another job, uid or key gives another token; a ticket is never a token.
  const std::string t = regroup::JobToken("k3y", "team-a/victim", "c0ffee-uid");
  EXPECT_NE(t, regroup::JobToken("k3y", "team-b/victim", "c0ffee-uid"));
  EXPECT_NE(t, regroup::JobToken("k3y", "team-a/victim", "other-uid"));
  EXPECT_NE(t, regroup::JobToken("other", "team-a/victim", "c0ffee-uid"));
  EXPECT_EQ(regroup::JobToken("", "a/b", "u").size(), 64u) << "an empty key is still a key";
}

TEST(JobToken, SecretsAreComparedWhole) {
  EXPECT_TRUE(regroup::SecretsEqual("abc", "abc"));
  EXPECT_TRUE(regroup::SecretsEqual("", ""));
  EXPECT_FALSE(regroup::SecretsEqual("abc", "abd"));
  EXPECT_FALSE(regroup::SecretsEqual("abc", "ab"));
  EXPECT_FALSE(regroup::SecretsEqual("", "a"));
}
