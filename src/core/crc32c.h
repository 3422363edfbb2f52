// CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and RocksDB use): the
// checksum of each record of an offload file (io/offload_file.h), so a torn
// or corrupted record is detected when it is read back, not trained on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

// The CRC-32C of n bytes, continuing from `crc` (0 to start):
// crc32c(b, n2, crc32c(a, n1)) is the CRC of a then b. Through SSE4.2's
// crc32 instruction where the CPU has it, else a table.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table's answer, always (tests compare the two).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace loom
