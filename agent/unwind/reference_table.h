// The reference unwind table builder, for tests and benchmarks only (library
// tlsprof::unwind_reference): the rows of each FDE as libdw's own CFI
// interpreter gives them, one dwarf_cfi_addrframe call per row. The
// production builder (BuildUnwindTable) must give the same rows and
// statistics on every well-formed input; unwind_test and the eh_frame fuzz
// target compare the two. Not bounded against hostile input (an FDE of N rows
// costs N^2, libdw reads the whole file's DWARF and inflates what it finds):
// never call it on files another process controls. Thread-safe.
#pragma once

#include <memory>
#include <string_view>

#include "agent/unwind/unwind_table.h"
#include "common/result.h"

namespace tlsprof::unwind {

// As BuildUnwindTable, with libdw interpreting the CFI; cfi_instructions,
// cut_fdes and cut_at_image_cap stay 0 (libdw does not report them).
Result<std::shared_ptr<const UnwindTable>> BuildReferenceUnwindTable(int fd, std::string_view display_path);

}  // namespace tlsprof::unwind
