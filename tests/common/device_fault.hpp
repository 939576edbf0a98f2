// What the GPU backends' device index-check tests share: the fault an earlier call recorded on `device`,
// raised by flashport::check_device once, naming the bad argument and where it was found.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <string>

#include "flashport/attention.hpp"
#include "flashport/error.hpp"

namespace flashport::test {

/// check_device(device) raises the recorded fault, naming one of `args` (with several broken indices any
/// may be the one recorded), containing `fragment` and "found on <backend>:<index>", exactly once.
inline void expect_recorded_fault(Device device, const char* backend, std::initializer_list<std::string> args,
                                  const std::string& fragment) {
  const std::string where = std::string("found on ") + backend + ":" + std::to_string(device.index);
  try {
    check_device(device);
    ADD_FAILURE() << "no device fault recorded for " << *args.begin();
  } catch (const Error& e) {
    EXPECT_NE(std::find(args.begin(), args.end(), e.argument()), args.end()) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_device(device)) << "a fault is raised once";
}

}  // namespace flashport::test
