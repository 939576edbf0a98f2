// Umbrella header of the flashport C++ API.
#pragma once

#include "flashport/attention.hpp"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"
