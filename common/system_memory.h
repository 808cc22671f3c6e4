// What the machine's memory allows: read where a size is about to be allocated from it.
#pragma once

#include <cstdint>

namespace recall {

// The available physical memory, MemAvailable in /proc/meminfo (0 if unknown).
int64_t AvailableMemoryBytes();

}  // namespace recall
