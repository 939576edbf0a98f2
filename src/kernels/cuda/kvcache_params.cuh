// Kernel arguments of kvcache_append.cu: core/problem.h's KvAppendParams, which the CDNA append shares.
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

using KvAppendParams = flashport::KvAppendParams;

}  // namespace flashport::cuda
